package headwater.capture;

import java.lang.reflect.InvocationTargetException;
import java.util.ArrayDeque;
import java.util.Deque;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.BinaryExpression;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StreamingQuery;
import scala.Option;

/**
 * The watermarks by which a micro-batch's aggregates drop late rows, read from its executed plan in
 * one call: walking the plan over py4j took a call or more per node and property, every batch.
 *
 * <p>The streaming engine's classes ({@code StreamingQueryWrapper}, {@code StateStoreSaveExec}) are reached by
 * name and reflection: Spark 4.1 moved them to other packages, and this way one jar serves every 4.x.
 */
public final class Watermarks {
    private Watermarks() {
    }

    /**
     * Per {@code StateStoreSaveExec} in {@code root}, as a JSON list: {@code keys}, the expression ids of
     * its key attributes, and {@code late}, the watermark (microseconds) at or before which its rows are
     * late this batch, or null where it drops none (complete mode, or no watermark).
     */
    public static String late(SparkPlan root) {
        StringBuilder json = new StringBuilder("[");
        Deque<SparkPlan> nodes = new ArrayDeque<>();
        nodes.push(root);
        while (!nodes.isEmpty()) {
            SparkPlan node = nodes.pop();
            if (SAVE.equals(node.getClass().getSimpleName())) {
                if (json.length() > 1) {
                    json.append(',');
                }
                json.append("{\"keys\":[");
                boolean first = true;
                for (Attribute key : SparkLine.<Attribute>asJava(property(node, "keyExpressions"))) {
                    if (key instanceof AttributeReference) {
                        json.append(first ? "" : ",").append(key.exprId().id());
                        first = false;
                    }
                }
                json.append("],\"late\":").append(lateOf(node)).append('}');
            }
            for (SparkPlan child : SparkLine.asJava(node.children())) {
                nodes.push(child);
            }
        }
        return json.append(']').toString();
    }

    /** The save's watermark for late rows (<watermark column> <= <watermark>, in microseconds), or "null". */
    private static String lateOf(SparkPlan save) {
        Option<OutputMode> mode = property(save, "outputMode");
        Option<Expression> expression = property(save, "watermarkExpressionForLateEvents");
        if ((mode.isDefined() && mode.get().toString().equalsIgnoreCase("complete")) || expression.isEmpty()) {
            return "null";
        }
        Literal watermark = (Literal) ((BinaryExpression) expression.get()).right();
        return Long.toString(((Number) watermark.value()).longValue());
    }

    /** The executed plan of the micro-batch that {@code query} (as {@code session.streams()} gives it) runs now:
     * {@code StreamingQueryWrapper.streamingQuery().lastExecution().executedPlan()}. */
    static SparkPlan lastExecutedPlan(StreamingQuery query) {
        return property(property(property(query, "streamingQuery"), "lastExecution"), "executedPlan");
    }

    /** The value of {@code object}'s public method {@code name} of no arguments (a Scala field's accessor). */
    @SuppressWarnings("unchecked")
    private static <T> T property(Object object, String name) {
        try {
            return (T) object.getClass().getMethod(name).invoke(object);
        } catch (NoSuchMethodException | IllegalAccessException e) {
            throw new IllegalStateException(object.getClass().getName() + " has no public " + name + "(): "
                                            + "a Spark headwater was not built for", e);
        } catch (InvocationTargetException e) {
            throw new IllegalStateException(object.getClass().getName() + "." + name + "() failed", e.getCause());
        }
    }

    private static final String SAVE = "StateStoreSaveExec";
}

package headwater.capture;

import java.util.ArrayDeque;
import java.util.Deque;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.BinaryExpression;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.streaming.operators.stateful.StateStoreSaveExec;
import org.apache.spark.sql.streaming.OutputMode;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The watermarks by which a micro-batch's aggregates drop late rows, read from its executed plan in
 * one call: walking the plan over py4j took a call or more per node and property, every batch.
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
            if (node instanceof StateStoreSaveExec save) {
                if (json.length() > 1) {
                    json.append(',');
                }
                json.append("{\"keys\":[");
                boolean first = true;
                for (Attribute key : CollectionConverters.asJava(save.keyExpressions())) {
                    if (key instanceof AttributeReference) {
                        json.append(first ? "" : ",").append(key.exprId().id());
                        first = false;
                    }
                }
                json.append("],\"late\":").append(late(save)).append('}');
            }
            for (SparkPlan child : CollectionConverters.asJava(node.children())) {
                nodes.push(child);
            }
        }
        return json.append(']').toString();
    }

    /** The save's watermark for late rows (<watermark column> <= <watermark>, in microseconds), or "null". */
    private static String late(StateStoreSaveExec save) {
        Option<OutputMode> mode = save.outputMode();
        Option<Expression> expression = save.watermarkExpressionForLateEvents();
        if ((mode.isDefined() && mode.get().toString().equalsIgnoreCase("complete")) || expression.isEmpty()) {
            return "null";
        }
        Literal watermark = (Literal) ((BinaryExpression) expression.get()).right();
        return Long.toString(((Number) watermark.value()).longValue());
    }
}

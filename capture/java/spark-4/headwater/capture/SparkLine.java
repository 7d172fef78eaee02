package headwater.capture;

import java.util.List;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.classic.ExpressionUtils;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * What the jar's classes do differently on each Spark line, for Spark 4.x (Scala 2.13): its twin for Spark 3.5
 * (Scala 2.12) is {@code java/spark-3.5/headwater/capture/SparkLine.java}, with the same methods. Everything
 * else in the jar is compiled, as it is, against each line's jars ({@code capture/jar.py}).
 */
final class SparkLine {
    private SparkLine() {
    }

    /** A column calling {@code method} on {@code target} with {@code arguments}: Catalyst's {@code Invoke},
     * nondeterministic and never null-propagating, so that Spark neither folds nor moves it. */
    static Column invoke(Literal target, String method, DataType type, List<Expression> arguments) {
        return ExpressionUtils.column(new Invoke(target, method, type, CollectionConverters.asScala(arguments).toList(),
                CollectionConverters.asScala(List.<AbstractDataType>of()).toList(), false, false, false));
    }

    /** The Catalyst expression of a column. */
    static Expression expression(Column column) {
        return ExpressionUtils.expression(column);
    }

    /** A Scala sequence as a Java list. */
    static <T> List<T> asJava(scala.collection.Seq<T> items) {
        return CollectionConverters.asJava(items);
    }

    /** Spark's Arrow writer of rows of {@code schema}: timestamps in UTC, duplicate field names allowed, Arrow's
     * plain (not large) string and binary vectors. */
    static ArrowWriter arrowWriter(StructType schema) {
        return ArrowWriter.create(schema, "UTC", false, false);
    }
}

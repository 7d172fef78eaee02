package headwater.capture;

import java.io.Serializable;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.function.Supplier;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The JVM half of one traced query's per-batch hook ({@code tracer.BatchHook}): what the hook asks of Spark
 * every batch, one call into the JVM each. Built from PySpark, each step was several py4j calls, some of
 * them lookups of a class by name that scan every jar on the class path when they miss: about 50 ms a
 * batch on the stream's own thread, before the batch's job could start.
 */
public final class Hook {
    private final String rowHash;
    private final String rid;
    private final Column[] named;

    /**
     * {@code rowHash}: the column of each output row's rid before its batch ({@code _hw_row}); {@code rid}: the
     * output rid's column ({@code _hw_rid}); {@code named}: the sink's columns, as the user named them.
     */
    public Hook(String rowHash, String rid, Column[] named) {
        this.rowHash = rowHash;
        this.rid = rid;
        this.named = named.clone();
    }

    /** {@code rows} with each row's output rid: its row hash and the batch, the batch id hashed as text
     * (a number would be written into the generated code, which Spark would then compile every batch). */
    public Dataset<Row> withRid(Dataset<Row> rows, String batchId) {
        return withRid(rows, functions.lit(batchId));
    }

    /** {@code rows} with each row's output rid: its row hash and {@code batch}, the batch id as text. */
    private Dataset<Row> withRid(Dataset<Row> rows, Column batch) {
        return rows.withColumn(rid, functions.xxhash64(functions.col(rowHash), batch));
    }

    /** What the sink gets of {@code rows} (from {@link #withRid}): its columns, through the filter {@code journal}
     * (a journal's column) unless it is null. */
    public Dataset<Row> sinkRows(Dataset<Row> rows, Column journal) {
        return (journal == null ? rows : rows.where(journal)).select(named);
    }

    /**
     * The sink's rows of the streaming frame {@code rows}, each with its output rid, computed in the streaming
     * plan: its row hash and the id of the micro-batch computing it ({@link #batchId}), the same rid as
     * {@link #withRid} gives in a batch's hook. With this, Spark can write the sink itself, with no hook.
     */
    public Dataset<Row> streamingSinkRows(Dataset<Row> rows) {
        return streamingSinkRows(rows, null);
    }

    /**
     * {@link #streamingSinkRows(Dataset)} through the filter {@code journal} (a journal's column, or null): the
     * frame a per-batch hook gets when the sink's own lineage is journaled in the streaming plan, so that the
     * hook builds no Dataset of its own a batch.
     */
    public Dataset<Row> streamingSinkRows(Dataset<Row> rows, Column journal) {
        return sinkRows(withRid(rows, batchId()), journal);
    }

    /**
     * The id of the micro-batch that computes a row, as text: the local property Spark's micro-batch engine
     * sets on the thread running the batch, which the batch's tasks get with their job. Nondeterministic, so
     * that Spark never folds it into a constant of one batch; read once a task.
     */
    public static Column batchId() {
        // Typed as the JDK's Supplier, so that the generated code names no class of this jar.
        Literal target = new Literal(new BatchId(), new ObjectType(Supplier.class));
        return SparkLine.invoke(target, "get", DataTypes.StringType, List.<Expression>of());
    }

    private static final class BatchId implements Supplier<Object>, Serializable {
        private static final long serialVersionUID = 1L;
        private transient TaskContext task;
        private transient UTF8String id;

        @Override
        public Object get() {
            TaskContext now = TaskContext.get();
            if (now == null) {  // evaluated on the driver, by the thread that runs the batch
                return UTF8String.fromString(known(SparkSession.active().sparkContext().getLocalProperty(KEY)));
            }
            if (now != task) {
                id = UTF8String.fromString(known(now.getLocalProperty(KEY)));
                task = now;
            }
            return id;
        }

        private static String known(String id) {
            if (id == null) {
                throw new IllegalStateException("no micro-batch id (" + KEY + ") where headwater's output rid is "
                                                + "computed: the rows are not a streaming query's micro-batch");
            }
            return id;
        }

        private static final String KEY = JobTimes.BATCH_ID;
    }

    /** {@link Watermarks#late} of the micro-batch that query {@code queryId} of {@code session} runs now. */
    public String late(SparkSession session, String queryId) {
        StreamingQuery query = session.streams().get(queryId);
        if (query == null) {
            throw new NoSuchElementException("streaming query " + queryId + " is not active in the traced session");
        }
        return Watermarks.late(Watermarks.lastExecutedPlan(query));
    }
}

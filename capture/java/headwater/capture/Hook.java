package headwater.capture;

import java.util.NoSuchElementException;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.execution.streaming.runtime.IncrementalExecution;
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryWrapper;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.StreamingQuery;

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
        return rows.withColumn(rid, functions.xxhash64(functions.col(rowHash), functions.lit(batchId)));
    }

    /** What the sink gets of {@code rows} (from {@link #withRid}): its columns, through the filter {@code journal}
     * (a journal's column) unless it is null. */
    public Dataset<Row> sinkRows(Dataset<Row> rows, Column journal) {
        return (journal == null ? rows : rows.where(journal)).select(named);
    }

    /** {@link Watermarks#late} of the micro-batch that query {@code queryId} of {@code session} runs now. */
    public String late(SparkSession session, String queryId) {
        StreamingQuery query = session.streams().get(queryId);
        if (query == null) {
            throw new NoSuchElementException("streaming query " + queryId + " is not active in the traced session");
        }
        IncrementalExecution execution = ((StreamingQueryWrapper) query).streamingQuery().lastExecution();
        return Watermarks.late(execution.executedPlan());
    }
}

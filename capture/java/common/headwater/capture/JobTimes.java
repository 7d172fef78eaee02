package headwater.capture;

import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobEnd;
import org.apache.spark.scheduler.SparkListenerJobStart;

/**
 * Job time of streaming queries' micro-batches, split into the user's and capture's, summed in the JVM.
 *
 * <p>Spark tags a micro-batch's jobs with its query id (a local property the stream's thread sets), and
 * the per-batch hook tags capture's own jobs with {@code headwater.capture}. Every other job, and every
 * other event, costs this nothing more than Spark's own call of an empty method: unlike a listener in
 * Python, whose every event (each task's start and end among them) was a call through py4j's callback
 * server, competing with the stream for the driver's cores. Python reads the sums ({@link #totals}).
 */
public final class JobTimes extends SparkListener {
    static final String QUERY_ID = "sql.streaming.queryId"; // as jvm_listener.QUERY_ID_PROPERTY
    // The micro-batch's id, MicroBatchExecution.BATCH_ID_KEY: the same on every Spark line (its class moved in 4.1).
    static final String BATCH_ID = "streaming.sql.batchId";
    static final String CAPTURE = "headwater.capture"; // as jvm_listener.CAPTURE_PROPERTY

    private record Started(String key, long at) {
    }

    private final Map<Integer, Started> running = new ConcurrentHashMap<>();
    private final Map<String, Long> millis = new ConcurrentHashMap<>(); // by "query id\tpart"

    @Override
    public void onJobStart(SparkListenerJobStart event) {
        Properties properties = event.properties();
        String query = properties == null ? null : properties.getProperty(QUERY_ID);
        if (query == null) {
            return;
        }
        String part = properties.getProperty(CAPTURE) == null ? "user" : "capture";
        running.put(event.jobId(), new Started(query + "\t" + part, event.time()));
    }

    @Override
    public void onJobEnd(SparkListenerJobEnd event) {
        Started started = running.remove(event.jobId());
        if (started != null) {
            millis.merge(started.key(), Math.max(0L, event.time() - started.at()), Long::sum);
        }
    }

    /** Milliseconds of finished jobs so far, as tab-separated lines: query id, part, milliseconds. */
    public String totals() {
        StringBuilder lines = new StringBuilder();
        millis.forEach((key, total) -> lines.append(key).append('\t').append(total).append('\n'));
        return lines.toString();
    }
}

package headwater.capture;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.sql.streaming.StreamingQueryListener;
import org.apache.spark.sql.streaming.StreamingQueryProgress;

/**
 * Spark's progress of the traced streaming queries, heard in the JVM and kept, as Spark's own JSON, for
 * the tracer's thread to take ({@code listener.ProgressListener}).
 *
 * <p>A listener in Python (PySpark's {@code StreamingQueryListener}) was called through py4j's callback server
 * for every query of the session, traced or not, and PySpark turned each event into Python objects with
 * dozens of calls back into the JVM: each Java map it read ended in an exception, whose conversion looked
 * up classes by name, each miss a scan of every jar on the class path. That cost 70-90 ms of the driver's
 * CPU a batch, shared with the stream on a small driver. Here a query that is not watched costs a lookup in
 * a set, and a watched one its progress's JSON text.
 *
 * <p>A watched query's start and end are kept too, in the same queue, as JSON objects of their own with a
 * {@code "headwater"} member ({@code "started"} or {@code "terminated"}, the end with Spark's exception text if the
 * query failed): what the tracer's OpenLineage events say (START, COMPLETE, FAIL). Spark's end event names the query
 * by id only, so the names of the watched queries started are kept by id until they end.
 */
public final class Progress extends StreamingQueryListener {
    private static final long serialVersionUID = 1L;
    static final int MOST = 10_000; // progress events kept for the tracer's thread; beyond, counted lost

    private final Set<String> watched = ConcurrentHashMap.newKeySet();
    private final BlockingQueue<String> queued = new LinkedBlockingQueue<>(MOST);
    private final AtomicLong lost = new AtomicLong();
    private final Map<String, String> names = new ConcurrentHashMap<>(); // watched queries running: id -> name
    private static final ObjectMapper JSON = new ObjectMapper();

    /** Keep the progress of the streaming query named {@code name} (Spark's query name). */
    public void watch(String name) {
        watched.add(name);
    }

    /** Keep no more progress of the streaming query named {@code name}. */
    public void forget(String name) {
        watched.remove(name);
    }

    @Override
    public void onQueryStarted(QueryStartedEvent event) {
        String name = event.name();
        if (name == null || !watched.contains(name)) {
            return;
        }
        names.put(event.id().toString(), name);
        Map<String, Object> started = lifecycle("started", name, event.id().toString(), event.runId().toString());
        started.put("timestamp", event.timestamp());
        keep(started);
    }

    @Override
    public void onQueryProgress(QueryProgressEvent event) {
        StreamingQueryProgress progress = event.progress();
        String name = progress.name();
        if (name != null && watched.contains(name) && !queued.offer(progress.json())) {
            lost.incrementAndGet();
        }
    }

    @Override
    public void onQueryTerminated(QueryTerminatedEvent event) {
        String name = names.remove(event.id().toString());
        if (name == null) {
            return;
        }
        Map<String, Object> ended = lifecycle("terminated", name, event.id().toString(), event.runId().toString());
        ended.put("exception", event.exception().isDefined() ? event.exception().get() : null);
        keep(ended);
    }

    private static Map<String, Object> lifecycle(String what, String name, String id, String runId) {
        Map<String, Object> record = new LinkedHashMap<>();
        record.put("headwater", what);
        record.put("name", name);
        record.put("id", id);
        record.put("runId", runId);
        return record;
    }

    private void keep(Map<String, Object> record) {
        try {
            if (!queued.offer(JSON.writeValueAsString(record))) {
                lost.incrementAndGet();
            }
        } catch (JsonProcessingException e) { // a map of strings and numbers always writes
            lost.incrementAndGet();
        }
    }

    /**
     * The progress (and starts and ends) kept since the last call, Spark's JSON of each, one a line, in the order
     * Spark gave them; waits up to {@code waitMs} for the first, and gives "" if none came.
     */
    public String take(long waitMs) throws InterruptedException {
        String first = queued.poll(waitMs, TimeUnit.MILLISECONDS);
        if (first == null) {
            return "";
        }
        List<String> rest = new ArrayList<>();
        queued.drainTo(rest);
        StringBuilder lines = new StringBuilder(first);
        for (String json : rest) {
            lines.append('\n').append(json);
        }
        return lines.toString();
    }

    /** Progress events not kept because the tracer's thread had not taken the earlier ones. */
    public long lost() {
        return lost.get();
    }
}

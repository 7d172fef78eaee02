package headwater.capture;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.Serializable;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.XXH64;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.LongAccumulator;
import org.apache.spark.util.TaskCompletionListener;

/**
 * The hot path of lineage capture: a filter condition, true for every row, that writes the narrow
 * lineage columns it is given (rids and coordinates, never the user's columns) to the host's journal
 * folder, one file per task, from the JVM. Nothing in the task waits for Python or for the broker:
 * headwater's drain (Python, capture/journal.py) turns each file into lineage payloads and sends them.
 *
 * <p>The condition is Catalyst's {@code Invoke} of {@link #test} on this object (a literal in the plan, so
 * each task gets its own copy) with one struct column, the publisher's fields: Spark hands it each row's
 * struct as it holds it, an {@code InternalRow}, which goes to the Arrow writer as it is. (A Java UDF of
 * a {@code Row} cost Spark's conversion of every row to an external {@code Row} and back: on the window
 * shape's 100,000-row batches 990 ms against 900 ms with this.)
 *
 * <p>Each row is a struct whose fields are, by position, as the publisher's spec says: the fields listed
 * in {@code inputs} are the sources of edges (a struct whose first field is its rid, or a list of such
 * structs); {@code late} names a field (microseconds) by which rows are late. What the batch needs (its
 * id, run, sampled fraction and each aggregate's watermark for late rows) is read from the task's local
 * property {@code property}, set by the per-batch hook; without it (a job the hook did not start, or the
 * hook's {@code NOT_CAPTURED}: a batch the budget takes to log-only) nothing is written, but for one
 * case: a job Spark runs for a micro-batch before the hook is called. Spark's {@code ForeachBatchSink}
 * turns the batch's plan into an RDD before it calls the hook, and that already runs the jobs the plan
 * needs at once (a range partitioner's sample for a sort or {@code repartitionByRange}, the count of a
 * distributed sequence), which compute the stages below and keep their shuffle output: rows entering an
 * aggregate there would be journaled never. In such a job (Spark's batch id and query id are its local
 * properties) the setting is the one those give ({@link #sparkSetting}): the batch, the run, every row
 * (no sample); a publisher that must tell late rows knows no watermark there and counts the task failed,
 * so the batch is logged a gap.
 *
 * <p>In each task: late rows are left out (their field at or before the batch's watermark for
 * {@code op}); a sampled batch keeps the rows (mode {@code row}: by field 0, the row's own rid) or
 * the inputs (mode {@code input}: each by its own rid, unsampled ones set null) whose rid is in the
 * sample, as {@code publish.sampled} decides; edges are counted as the drain will make them (one per
 * non-null input struct, one per non-null element of an input list). At the task's successful end the
 * file is written under a temporary name and renamed to {@code *.rows}; a file that would take the
 * folder past {@code maxBytes} is not written and its edges are counted dropped, and edges written
 * while the breaker file says the broker is away are counted spilled. A failure here never fails the
 * user's task: it is counted in {@code failed}.
 *
 * <p>{@code counts}, one traced query's accumulators, in order: rows (of {@code row}-mode publishers:
 * the sink's), edges, spilled edges, dropped edges, bytes written, nanoseconds spent here, failed tasks.
 *
 * <p>File layout: the publisher's spec (one JSON line, from Python), the batch's setting (one JSON
 * line), then an Arrow IPC stream of the journaled rows.
 *
 * <p>{@code folder} is the tracer's journal folder: its destination's ({@code destination}, the
 * folder's name under the host's spill root; see capture/delivery.py), so that a drain sends it to that
 * job's broker and topic only. On the driver's host the tracer's own thread drains it. An executor (a
 * JVM whose Spark executor id is not {@code driver}) journals into its own host's folder of that
 * destination ({@code destination} under {@code HEADWATER_SPILL_DIR} of its environment, else the
 * tracer's folder) and, after writing a file, makes sure a drain process runs for that folder: if
 * nobody holds the folder's {@code drain.lock} it starts {@code drain}'s command (JSON: {@code command},
 * a list, and {@code env}, a map, the job's delivery settings) with the folder's spill root, which takes
 * the lock, sends, and exits once idle. At most one check per folder every {@link #DRAIN_CHECK_MS} per JVM.
 */
public final class Journal implements Predicate<InternalRow>, Serializable {
    private static final long serialVersionUID = 1L;
    static final long SAMPLE_MODULUS = 1_000_003L; // as publish.SAMPLE_MODULUS
    static final int ROWS_PER_RECORD_BATCH = 65_536;
    static final long DRAIN_CHECK_MS = 5_000;
    static final String DRAIN_LOCK = "drain.lock"; // as journal.LOCK
    static final String NOT_CAPTURED = "none"; // as journal.NOT_CAPTURED: the hook's batch captures no edges
    private static final AtomicLong SEQUENCE = new AtomicLong();
    private static final Map<String, Long> DRAIN_CHECKED = new ConcurrentHashMap<>();
    private static final ObjectMapper JSON = new ObjectMapper(); // thread-safe for reading: one per JVM, not per task

    private final StructType schema;
    private final String spec;
    private final String folder;
    private final String destination;
    private final String property;
    private final long maxBytes;
    private final boolean sampleInputs;
    private final int[] inputs;
    private final int late;
    private final String op;
    private final String drain;
    private final LongAccumulator rows;
    private final LongAccumulator edges;
    private final LongAccumulator spilled;
    private final LongAccumulator dropped;
    private final LongAccumulator bytes;
    private final LongAccumulator nanos;
    private final LongAccumulator failed;
    private transient Task task;

    public Journal(StructType schema, String spec, String folder, String destination, String property,
                   long maxBytes, String mode, int[] inputs, int late, String op, String drain,
                   LongAccumulator[] counts) {
        this.schema = schema;
        this.spec = spec;
        this.folder = folder;
        this.destination = destination;
        this.property = property;
        this.maxBytes = maxBytes;
        this.sampleInputs = "input".equals(mode);
        this.inputs = inputs.clone();
        this.late = late;
        this.op = op;
        this.drain = drain;
        this.rows = counts[0];
        this.edges = counts[1];
        this.spilled = counts[2];
        this.dropped = counts[3];
        this.bytes = counts[4];
        this.nanos = counts[5];
        this.failed = counts[6];
    }

    /**
     * The filter condition over {@code struct} (of type {@code schema}, JSON), nondeterministic so that Spark
     * neither moves nor drops it: a call of {@link #test} on each row's struct as Spark holds it, with no
     * conversion to and from an external {@code Row} (Catalyst's {@code Invoke} of this journal, a literal).
     */
    public static Column column(Column struct, String schema, String spec, String folder, String destination,
                                String property, long maxBytes, String mode, int[] inputs, int late, String op,
                                String drain, LongAccumulator[] counts) {
        Journal journal = new Journal((StructType) DataType.fromJson(schema), spec, folder, destination, property,
                                      maxBytes, mode, inputs, late, op, drain, counts);
        // Typed as the JDK's Predicate, so that the generated code names no class of this jar.
        Literal target = new Literal(journal, new ObjectType(Predicate.class));
        return SparkLine.invoke(target, "test", DataTypes.BooleanType, List.of(SparkLine.expression(struct)));
    }

    @Override
    public boolean test(InternalRow row) {
        long started = System.nanoTime();
        try {
            if (task == null) {
                task = new Task(TaskContext.get());
            }
            task.add(row);
        } catch (RuntimeException e) {
            task.fail();
        } finally {
            nanos.add(System.nanoTime() - started);
        }
        return true;
    }

    @Override
    public String toString() {
        return "headwater journal";
    }

    static boolean sampled(long rid, double fraction) {
        return Math.floorMod(rid, SAMPLE_MODULUS) < (long) (fraction * SAMPLE_MODULUS);
    }

    /** One task's rows: kept in Arrow vectors, written to a file of the journal at the task's end. */
    private final class Task {
        private final String setting;
        private final Double fraction;
        private final Long watermark;
        private ArrowWriter writer;
        private ArrowStreamWriter stream;
        private OutputStream out;
        private Path temporary;
        private long batched;
        private long edgeCount;
        private long rowCount;
        private boolean broken;

        Task(TaskContext context) {
            String hooks = context == null ? null : context.getLocalProperty(property);
            this.setting = NOT_CAPTURED.equals(hooks) ? null
                : hooks != null || context == null ? hooks : sparkSetting(context);
            Double sample = null;
            Long mark = null;
            if (setting != null) {
                try {
                    JsonNode parsed = JSON.readTree(setting);
                    JsonNode given = parsed.get("fraction");
                    sample = given == null || given.isNull() ? null : given.asDouble();
                    if (late >= 0) {
                        // Without the aggregate's watermark its late rows cannot be told: publish none.
                        JsonNode marks = parsed.get("late");
                        if (marks == null || !marks.has(op)) {
                            throw new IllegalStateException("no watermark known for aggregate #" + op);
                        }
                        mark = marks.get(op).isNull() ? null : marks.get(op).asLong();
                    }
                    writer = SparkLine.arrowWriter(schema);
                    context.addTaskCompletionListener((TaskCompletionListener) this::finish);
                } catch (IOException | RuntimeException e) {
                    fail();
                }
            }
            fraction = sample;
            watermark = mark;
        }

        void add(InternalRow row) {
            rowCount++;
            if (setting == null || broken) {
                return;
            }
            InternalRow values = row;
            if (late >= 0 && watermark != null && !values.isNullAt(late) && values.getLong(late) <= watermark) {
                return;
            }
            long count = 0;
            if (sampleInputs) {
                for (int i : inputs) {
                    if (values.isNullAt(i)) {
                        continue;
                    }
                    int width = ((StructType) schema.fields()[i].dataType()).size();
                    if (fraction != null && !sampled(values.getStruct(i, width).getLong(0), fraction)) {
                        if (values == row) { // Spark's row, not ours to change
                            values = row.copy();
                        }
                        values.setNullAt(i);
                    } else {
                        count += edgesOf(values, i);
                    }
                }
                if (count == 0) {
                    return;
                }
            } else {
                if (fraction != null && !sampled(values.getLong(0), fraction)) {
                    return;
                }
                for (int i : inputs) {
                    count += edgesOf(values, i);
                }
            }
            writer.write(values);
            edgeCount += count;
            if (++batched >= ROWS_PER_RECORD_BATCH) {
                writeBatch();
            }
        }

        private long edgesOf(InternalRow values, int i) {
            if (values.isNullAt(i)) {
                return 0;
            }
            if (!(schema.fields()[i].dataType() instanceof ArrayType)) {
                return 1;
            }
            ArrayData list = values.getArray(i);
            long n = 0;
            for (int j = 0; j < list.numElements(); j++) {
                n += list.isNullAt(j) ? 0 : 1;
            }
            return n;
        }

        private void writeBatch() {
            try {
                if (stream == null) {
                    Path dir = hostFolder();
                    Files.createDirectories(dir);
                    temporary = dir.resolve("." + name() + ".tmp");
                    out = new BufferedOutputStream(Files.newOutputStream(temporary), 1 << 16);
                    out.write((spec + "\n" + setting + "\n").getBytes(StandardCharsets.UTF_8));
                    stream = new ArrowStreamWriter(writer.root(), null, Channels.newChannel(out));
                    stream.start();
                }
                writer.finish();
                stream.writeBatch();
                writer.reset();
                batched = 0;
            } catch (IOException e) {
                fail();
            }
        }

        void fail() {
            if (!broken) {
                broken = true;
                failed.add(1);
            }
        }

        private void finish(TaskContext ended) {
            long started = System.nanoTime();
            try {
                if (!broken && !ended.isFailed() && edgeCount > 0) {
                    if (batched > 0 || stream == null) {
                        writeBatch();
                    }
                    if (!broken) {
                        stream.end();
                        out.close();
                        out = null;
                        commit();
                    }
                }
                if (!sampleInputs) {
                    rows.add(rowCount);
                }
            } catch (IOException | RuntimeException e) {
                fail();
            } finally {
                close();
                nanos.add(System.nanoTime() - started);
            }
        }

        /** Rename the finished file into the journal, if the folder has room for it. */
        private void commit() throws IOException {
            Path dir = temporary.getParent();
            long size = Files.size(temporary);
            if (used(dir) + size > maxBytes) {
                dropped.add(edgeCount);
                return;
            }
            if (Files.exists(dir.resolve("breaker"))) {
                spilled.add(edgeCount);
            }
            edges.add(edgeCount);
            bytes.add(size);
            Files.move(temporary, dir.resolve(name() + ".rows"), StandardCopyOption.ATOMIC_MOVE);
            temporary = null;
            if (onExecutor()) {
                ensureDrain(dir);
            }
        }

        private void close() {
            try {
                if (out != null) {
                    out.close();
                }
                if (temporary != null) {
                    Files.deleteIfExists(temporary);
                }
            } catch (IOException e) {
                fail();
            }
            if (writer != null) {
                writer.root().close();
                writer = null;
            }
        }

        private String name() {
            TaskContext context = TaskContext.get();
            String who = context == null ? "0-0-0" : context.stageId() + "-" + context.partitionId() + "-"
                + context.taskAttemptId();
            return String.format("%020d-%s-%d", System.currentTimeMillis() * 1000, who, SEQUENCE.incrementAndGet());
        }
    }

    /**
     * The setting of a job Spark runs for a micro-batch of a streaming query before the per-batch hook is
     * called, from Spark's own local properties (null outside a micro-batch): as {@code journal.Setting}'s JSON.
     */
    static String sparkSetting(TaskContext context) {
        String batch = context.getLocalProperty(JobTimes.BATCH_ID);
        String query = context.getLocalProperty(JobTimes.QUERY_ID);
        if (batch == null || query == null) {
            return null;
        }
        return "{\"batch\": " + Long.parseLong(batch) + ", \"run\": " + runHash(query)
            + ", \"fraction\": null, \"late\": {}}";
    }

    /** The run a state node belongs to, as {@code rid.run_hash}: Spark's {@code xxhash64('state', queryId)}. */
    public static long runHash(String queryId) {
        long hash = 42L;
        for (String part : new String[] {"state", queryId}) {
            hash = XXH64.hashUTF8String(UTF8String.fromString(part), hash);
        }
        return hash;
    }

    private static boolean onExecutor() {
        SparkEnv env = SparkEnv.get();
        return env != null && !"driver".equals(env.executorId());
    }

    /**
     * The journal folder on this host: the destination's under an executor's own {@code HEADWATER_SPILL_DIR},
     * else the tracer's.
     */
    private Path hostFolder() {
        String own = onExecutor() ? System.getenv("HEADWATER_SPILL_DIR") : null;
        if (own == null || own.isEmpty()) {
            return Paths.get(folder);
        }
        return destination.isEmpty() ? Paths.get(own) : Paths.get(own).resolve(destination);
    }

    /** Start a drain process for {@code dir} unless one holds its lock (checked at most every few seconds). */
    private void ensureDrain(Path dir) throws IOException {
        if (drain == null || drain.isEmpty()) {
            return;
        }
        long now = System.currentTimeMillis();
        String key = dir.toString();
        Long last = DRAIN_CHECKED.get(key);
        if (last != null && now - last < DRAIN_CHECK_MS) {
            return;
        }
        boolean mine = last == null ? DRAIN_CHECKED.putIfAbsent(key, now) == null : DRAIN_CHECKED.replace(key, last, now);
        if (!mine) {
            return; // another task of this JVM checks now
        }
        try (FileChannel channel = FileChannel.open(dir.resolve(DRAIN_LOCK), StandardOpenOption.CREATE,
                StandardOpenOption.WRITE)) {
            FileLock lock = channel.tryLock();
            if (lock == null) {
                return; // a drain runs
            }
            lock.release();
        } catch (OverlappingFileLockException e) {
            return; // another thread of this JVM is checking
        }
        JsonNode parsed = JSON.readTree(drain);
        List<String> command = new ArrayList<>();
        parsed.get("command").forEach(part -> command.add(part.asText()));
        ProcessBuilder builder = new ProcessBuilder(command);
        for (Map.Entry<String, JsonNode> entry : parsed.get("env").properties()) {
            builder.environment().put(entry.getKey(), entry.getValue().asText());
        }
        // The drain finds the destination's folder under the spill root from the job's settings it is given.
        builder.environment().put("HEADWATER_SPILL_DIR", destination.isEmpty() ? key : dir.getParent().toString());
        builder.redirectErrorStream(true);
        builder.redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("drain.log").toFile()));
        builder.start();
    }

    /** Bytes the journal holds: files waiting to be drained, as {@code delivery.Spill.size} counts them. */
    static long used(Path dir) throws IOException {
        long total = 0;
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(dir)) {
            for (Path entry : entries) {
                String name = entry.getFileName().toString();
                if (name.endsWith(".rows") || name.endsWith(".msg")) {
                    try {
                        total += Files.size(entry);
                    } catch (IOException gone) {
                        // drained meanwhile
                    }
                }
            }
        }
        return total;
    }
}

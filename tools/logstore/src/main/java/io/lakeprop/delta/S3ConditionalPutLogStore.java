package io.lakeprop.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import java.util.Locale;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.S3AFileSystem;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Exception;

/**
 * A Delta {@code LogStore} for S3 whose commits are exclusive across JVMs and engines.
 *
 * <p>Delta commits version {@code N} of a table by creating {@code _delta_log/N.json}
 * if it is absent; two writers that both read version {@code N - 1} must not both
 * succeed. Delta's {@code S3SingleDriverLogStore} checks for the file, then writes it
 * with a plain PUT: exclusive inside one JVM only, so a second Spark application, or
 * delta-rs, can have its commit overwritten without either side noticing. Here every
 * commit file is one PUT with {@code If-None-Match: *}, which S3 (and S3-compatible
 * stores that implement conditional writes) applies atomically: the loser gets
 * {@code 412 Precondition Failed} (or {@code 409} while the winner's PUT is still in
 * flight), turned into the {@link FileAlreadyExistsException} on which Delta re-reads
 * the table and retries its commit at the next version. delta-rs commits the same way,
 * so the two engines exclude each other.
 *
 * <p>On Hadoop 3.4.2 and later the PUT goes through S3A's conditional create
 * ({@code fs.option.create.conditional.overwrite}), with everything S3A is configured
 * to add to a PUT (encryption, ACLs, requester-pays). Older S3A has no such option;
 * there the PUT is made with S3A's own SDK client, carrying the header itself.
 *
 * <p>Set it per scheme: {@code spark.delta.logStore.s3a.impl=io.lakeprop.delta.S3ConditionalPutLogStore}
 * (and the same for {@code s3} where that scheme is mapped to S3A).
 */
public class S3ConditionalPutLogStore extends HadoopFileSystemLogStore {

    /** Hadoop's create option for "create only if absent, atomically" (Hadoop 3.4.2+). */
    static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    public S3ConditionalPutLogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        byte[] body = lines(actions);
        if (overwrite) {
            // not a commit: Delta overwrites only files no reader relies on being exclusive
            try (FSDataOutputStream out = fs.create(path, true)) {
                out.write(body);
            }
            return;
        }
        if (!(fs instanceof S3AFileSystem)) {
            throw new IOException(
                    getClass().getSimpleName() + " commits to S3 through S3A; " + path + " is on "
                            + fs.getClass().getName() + ": set it for s3a (and s3 mapped to S3A) only");
        }
        S3AFileSystem s3a = (S3AFileSystem) fs;
        if (!createWithS3A(s3a, path, body)) {
            putWithSdk(s3a, path, body);
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false; // one PUT: the object appears whole or not at all
    }

    /** The conditional create of S3A; false where this S3A has no such option. */
    private static boolean createWithS3A(S3AFileSystem s3a, Path path, byte[] body) throws IOException {
        FSDataOutputStreamBuilder<?, ?> builder = s3a.createFile(path).overwrite(false);
        builder.must(CONDITIONAL_CREATE, true);
        FSDataOutputStream out;
        try {
            out = builder.build();
        } catch (IllegalArgumentException unknownOption) {
            if (String.valueOf(unknownOption.getMessage()).contains(CONDITIONAL_CREATE)) {
                return false;
            }
            throw unknownOption;
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException exists) {
            throw alreadyExists(path, exists);
        }
        try {
            out.write(body);
            out.close(); // the PUT happens here
        } catch (IOException failed) {
            if (isConflict(failed)) {
                throw alreadyExists(path, failed);
            }
            throw failed;
        }
        return true;
    }

    /** The same PUT with S3A's own client, for an S3A without conditional create. */
    private static void putWithSdk(S3AFileSystem s3a, Path path, byte[] body) throws IOException {
        PutObjectRequest request = PutObjectRequest.builder()
                .bucket(s3a.getBucket())
                .key(s3a.pathToKey(path))
                .overrideConfiguration(c -> c.putHeader("If-None-Match", "*"))
                .build();
        try {
            s3a.getS3AInternals()
                    .getAmazonS3Client("conditional Delta commit")
                    .putObject(request, RequestBody.fromBytes(body));
        } catch (S3Exception failed) {
            if (failed.statusCode() == 412 || failed.statusCode() == 409) {
                throw alreadyExists(path, failed);
            }
            throw new IOException("committing " + path + " failed: " + failed.getMessage(), failed);
        } catch (RuntimeException failed) {
            throw new IOException("committing " + path + " failed: " + failed, failed);
        }
    }

    /** A rejected conditional PUT, however S3A words it (412, 409 or "already exists"). */
    static boolean isConflict(Throwable failed) {
        for (Throwable t = failed; t != null; t = t.getCause()) {
            if (t instanceof org.apache.hadoop.fs.FileAlreadyExistsException
                    || t instanceof FileAlreadyExistsException) {
                return true;
            }
            if (t instanceof S3Exception) {
                int status = ((S3Exception) t).statusCode();
                return status == 412 || status == 409;
            }
            String message = String.valueOf(t.getMessage()).toLowerCase(Locale.ROOT);
            if (message.contains("precondition") || message.contains("conditionalrequestconflict")) {
                return true;
            }
        }
        return false;
    }

    private static FileAlreadyExistsException alreadyExists(Path path, Throwable cause) {
        FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
        exists.initCause(cause);
        return exists;
    }

    private static byte[] lines(Iterator<String> actions) throws IOException {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            body.write(actions.next().getBytes(StandardCharsets.UTF_8));
            body.write('\n');
        }
        return body.toByteArray();
    }
}

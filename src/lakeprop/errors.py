"""One exception hierarchy for the service.

Every error carries a numeric code, as in the ISCP design: 0 is success,
1-9999 are temporary (the work is retried), 10000 and above are permanent (the
job stops in state ``error`` until a person repairs it). ``is_temporary`` is
derived from the code, so a caller never has to know the concrete class.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Stable error codes. Temporary codes are below 10000."""

    OK = 0
    # temporary
    UNKNOWN_TEMPORARY = 1
    BROKER_UNAVAILABLE = 100
    DELIVERY_FAILED = 101
    SPARK_JOB_FAILED = 200
    ITERATION_TIMEOUT = 300
    ITERATION_CANCELED = 301
    CONSUMER_ERROR = 400
    STATE_CONFLICT = 500
    # permanent
    UNKNOWN_PERMANENT = 10000
    INVALID_CONFIG = 10001
    CHECKPOINT_IN_USE = 10002
    STATE_NOT_FOUND = 10003
    INVALID_ARGUMENT = 10004
    QUERY_FAILED = 10005
    INVALID_MESSAGE = 10100
    UNSUPPORTED_VERSION = 10101
    UNKNOWN_OPERATION = 10102
    INVALID_IDENTIFIER = 10103
    INVALID_SPEC = 10104
    UNKNOWN_CONSUMER = 10105
    INVALID_CONSUMER_OPTIONS = 10106
    MESSAGE_TOO_LARGE = 10107
    OFF_THE_JOB_PARTITION = 10108
    SOURCE_NOT_DELTA = 10200
    SOURCE_COLUMN_MISSING = 10201
    SOURCE_REPLACED = 10202
    SOURCE_SCHEMA_CHANGED = 10203
    SOURCE_FEED_OFF = 10204
    TARGET_MISSING = 10300
    CONSUMER_FAILED = 10400
    QUOTA_EXCEEDED = 10500
    OUT_OF_SCOPE = 10501
    TARGET_NOT_ALLOWED = 10502
    BULK_MATCHES_NOTHING = 10600
    BULK_NOT_FOUND = 10601
    BULK_WRONG_STATE = 10602
    BULK_IN_CLUSTER = 10603
    PIPELINE_CYCLE = 10700
    DOWNSTREAM_JOBS = 10701
    EXPECTATION_FAILED = 10702
    TARGET_TAKEN = 10703


TEMPORARY_LIMIT = 10000

DESCRIPTIONS: dict[ErrorCode, str] = {
    ErrorCode.OK: "success",
    ErrorCode.UNKNOWN_TEMPORARY: "a temporary error of no more specific kind",
    ErrorCode.BROKER_UNAVAILABLE: "the Kafka broker could not be reached or started",
    ErrorCode.DELIVERY_FAILED: "the broker did not confirm a change-log message in time",
    ErrorCode.SPARK_JOB_FAILED: "a Spark job of an iteration failed",
    ErrorCode.ITERATION_TIMEOUT: "an iteration ran longer than `engine.iteration_timeout` and "
    "was cancelled, its Spark jobs too",
    ErrorCode.ITERATION_CANCELED: "an iteration was cancelled (unregister, update with "
    "interrupt, pause, resync, shutdown)",
    ErrorCode.CONSUMER_ERROR: "a consumer raised an unexpected exception",
    ErrorCode.STATE_CONFLICT: "a state table write kept conflicting with other instances' "
    "writes (`cluster.enabled`); the micro-batch fails and is replayed",
    ErrorCode.UNKNOWN_PERMANENT: "a permanent error of no more specific kind",
    ErrorCode.INVALID_CONFIG: "the configuration file, an environment override or `--set` is wrong",
    ErrorCode.CHECKPOINT_IN_USE: "another instance holds the checkpoint's lock",
    ErrorCode.STATE_NOT_FOUND: "no state tables at `state.location`: the service never ran there",
    ErrorCode.INVALID_ARGUMENT: "a command-line argument cannot be used (malformed JSON, a "
    "missing file)",
    ErrorCode.QUERY_FAILED: "the streaming query failed more than `engine.max_query_restarts` "
    "times in a row; the service stops",
    ErrorCode.INVALID_MESSAGE: "a change-log message is not a valid envelope",
    ErrorCode.UNSUPPORTED_VERSION: "a change-log message of an envelope version this service "
    "does not read",
    ErrorCode.UNKNOWN_OPERATION: "a change-log message names an unknown operation",
    ErrorCode.INVALID_IDENTIFIER: "a database, table, column or job name is not a plain identifier",
    ErrorCode.INVALID_SPEC: "a job spec (trigger or iteration detail) does not validate",
    ErrorCode.UNKNOWN_CONSUMER: "a job spec names a consumer type that cannot be found",
    ErrorCode.INVALID_CONSUMER_OPTIONS: "a consumer's options do not validate",
    ErrorCode.MESSAGE_TOO_LARGE: "a change-log message is larger than `kafka.max_message_bytes`",
    ErrorCode.OFF_THE_JOB_PARTITION: "a job message on a change-log partition other than "
    "the job partition (0), read by a service with `cluster.enabled`: every instance "
    "decides the pipeline graph in one order",
    ErrorCode.SOURCE_NOT_DELTA: "the source table is missing or not a Delta table",
    ErrorCode.SOURCE_COLUMN_MISSING: "the source lacks a column the job's consumer needs",
    ErrorCode.SOURCE_REPLACED: "the source was replaced by a table with a new identity: "
    "re-register the job",
    ErrorCode.SOURCE_SCHEMA_CHANGED: "the source's columns changed in a way its change feed "
    "cannot be read across (a column dropped or renamed, a type changed): resync the job",
    ErrorCode.SOURCE_FEED_OFF: "a table a job follows beside its source (a join) has its "
    "change feed off",
    ErrorCode.TARGET_MISSING: "the consumer's target table is missing: resync or re-register "
    "the job",
    ErrorCode.CONSUMER_FAILED: "a consumer failed in a way a retry will not fix (also: a write "
    "that does not resolve against an altered target)",
    ErrorCode.QUOTA_EXCEEDED: "over the account's live-job quota",
    ErrorCode.OUT_OF_SCOPE: "a source or target outside the account's databases",
    ErrorCode.TARGET_NOT_ALLOWED: "a target another account's live job reads or writes, or "
    "inside the service's own state",
    ErrorCode.BULK_MATCHES_NOTHING: "a bulk selector matches no live job",
    ErrorCode.BULK_NOT_FOUND: "no bulk operation with that id",
    ErrorCode.BULK_WRONG_STATE: "a bulk operation in a state that does not allow the request",
    ErrorCode.BULK_IN_CLUSTER: "bulk operations are not run by a service with `cluster.enabled`",
    ErrorCode.PIPELINE_CYCLE: "a job would read, through other jobs, the table it writes: the "
    "cycle is named",
    ErrorCode.DOWNSTREAM_JOBS: "an unregister of a job whose target other jobs of its account "
    "read, or an update that would stop writing a target other jobs read: they are named; "
    "unregister them first, or send the unregister with `cascade`",
    ErrorCode.EXPECTATION_FAILED: "rows broke an expectation whose action is `fail`: the rule "
    "and a few keys are named, and nothing of the range was written",
    ErrorCode.TARGET_TAKEN: "a register or update whose target another live job writes: "
    "that job is named; each target has one writer, so give this one another `target_table`",
}
"""What each code means, for the error-code reference (``docs/reference``)."""


def is_temporary_code(code: int) -> bool:
    """True for codes 1-9999: the failed work may succeed when retried."""
    return 0 < code < TEMPORARY_LIMIT


class LakepropError(Exception):
    """Base of every error the service raises on purpose."""

    default_code: ErrorCode = ErrorCode.UNKNOWN_PERMANENT

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = int(code if code is not None else self.default_code)

    @property
    def is_temporary(self) -> bool:
        return is_temporary_code(self.code)

    def __str__(self) -> str:
        return self.message


class TemporaryError(LakepropError):
    """Work that failed for a reason that may go away: retry with backoff."""

    default_code = ErrorCode.UNKNOWN_TEMPORARY


class PermanentError(LakepropError):
    """Work that will keep failing until someone changes the input or the spec."""

    default_code = ErrorCode.UNKNOWN_PERMANENT


class InvalidConfigError(PermanentError):
    """The configuration file or environment is wrong."""

    default_code = ErrorCode.INVALID_CONFIG


class StateNotFoundError(PermanentError):
    """The service's state tables are not where the config says (it never ran there)."""

    default_code = ErrorCode.STATE_NOT_FOUND


class InvalidArgumentError(PermanentError):
    """A command line argument that cannot be used (malformed JSON, a missing file)."""

    default_code = ErrorCode.INVALID_ARGUMENT


class InvalidMessageError(PermanentError):
    """A change log message that cannot be applied; it goes to the rejects table."""

    default_code = ErrorCode.INVALID_MESSAGE


class InvalidIdentifierError(InvalidMessageError):
    """A database, table, column or job name that is not a safe SQL identifier."""

    default_code = ErrorCode.INVALID_IDENTIFIER


class InvalidSpecError(InvalidMessageError):
    """A job spec (trigger or iteration detail) that does not validate."""

    default_code = ErrorCode.INVALID_SPEC


class SourceTableError(PermanentError):
    """The source table of a job is missing, not a Delta table, or lacks a column."""

    default_code = ErrorCode.SOURCE_NOT_DELTA


class TenantError(PermanentError):
    """A job its account may not have: over a quota, outside its scope, or writing
    a table that is not its account's to write."""

    default_code = ErrorCode.QUOTA_EXCEEDED


class BulkError(PermanentError):
    """A bulk request that cannot be carried out: its selector matches no job, it
    names an unknown bulk operation, or one in a state that does not allow it."""

    default_code = ErrorCode.BULK_NOT_FOUND


class PipelineError(PermanentError):
    """A change that would break the pipeline graph: a cycle, a second writer of a
    target, or a drop or re-target that would leave jobs reading a table nothing
    writes any more."""

    default_code = ErrorCode.PIPELINE_CYCLE


class ExpectationFailed(PermanentError):
    """Rows going to a job's target broke one of its ``fail`` expectations."""

    default_code = ErrorCode.EXPECTATION_FAILED


class DeliveryError(TemporaryError):
    """The Kafka broker did not confirm a change log message."""

    default_code = ErrorCode.DELIVERY_FAILED


class BrokerError(TemporaryError):
    """The Kafka broker could not be reached or started."""

    default_code = ErrorCode.BROKER_UNAVAILABLE


class UnknownConsumerError(InvalidSpecError):
    """A job spec names a consumer type that is not registered."""

    default_code = ErrorCode.UNKNOWN_CONSUMER


class InvalidConsumerOptionsError(InvalidSpecError):
    """The options of a consumer do not validate."""

    default_code = ErrorCode.INVALID_CONSUMER_OPTIONS


class StateConflictError(TemporaryError):
    """A shared state table write kept conflicting with other instances' writes."""

    default_code = ErrorCode.STATE_CONFLICT

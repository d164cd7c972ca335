// The TypeScript client of idemd, the idempotency service: typed calls for claim,
// complete, release, extend, lookup and purge; run, which runs a function at most once
// per key; once, consume, messageKey and stepKey, for queue consumers; the
// abandoned-keys feed and the Completer, which finishes the work holders left pending;
// KeyRing, which seals stored results and recovery points (docs/sealing.md).
export {
  type AbandonedKey,
  type AbandonedOptions,
  type AbandonedPage,
  type Acquired,
  type CallOptions,
  type Claim,
  type ClaimOptions,
  type ClientOptions,
  type Finished,
  type FinishOptions,
  IdemClient,
  type KeyRecord,
  type Lease,
  newClaimSecret,
  type RecoveryPoint,
  type ReleaseOptions,
  type ResponseInit,
  type RunOptions,
  type RunResult,
  type SealingOptions,
  type StoredResponse,
  type Verdict,
} from "./client.js";
export {
  FailedError,
  FingerprintMismatchError,
  IdemError,
  InProgressError,
  LeaseExpiredError,
  LeaseLostError,
  NotFoundError,
  PayloadTooLargeError,
  PermanentError,
  ProblemError,
  type ProblemInit,
  QuotaExceededError,
  RawResultUnavailableError,
  ResultNotStoredError,
  UnavailableError,
  UnsealableError,
  type UnsealableReason,
} from "./errors.js";
export { KeyRing, type KeyRingOptions, type SealKey } from "./seal.js";
export { Completer, type CompleterOptions, type CompleterStats } from "./completer.js";
export { messageHeader, messageKey, stepKey } from "./key.js";

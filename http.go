package idem

import "time"

// Header fields of the HTTP contract, shared by the server middleware
// (idemhttp, idem proxy) and the client (idemclient).
const (
	// HeaderKey carries the idempotency key, unless a deployment names
	// another field.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a response the server answered from its
	// store instead of running the operation again.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted is "true" on the answer to a retry whose original
	// body was too large to store: a 410 response_body_omitted problem.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderExpires gives, on a stored answer and on every replay of it,
	// when the key's record expires (an RFC 9110 HTTP-date): until then a
	// retry with the key gets this answer, after it the key is new again.
	HeaderExpires = "Idempotency-Key-Expires"
	// HeaderOutcome is set by a service behind idem proxy to tell the proxy
	// what becomes of the key, whatever the proxy's status lists say:
	// "release" (nothing was committed: free the key), "unknown" (it may
	// have been: record the outcome unknown) or "store" (replay this
	// answer). The proxy removes it before the client sees the answer.
	HeaderOutcome = "Idempotency-Outcome"
)

// The stable codes of the contract's problem responses (RFC 9457 documents
// with a code member). Clients may rely on them; the human-readable detail
// may change.
const (
	CodeKeyMissing       = "idempotency_key_missing" // 400
	CodeKeyInvalid       = "idempotency_key_invalid" // 400
	CodeBodyInvalid      = "request_body_invalid"    // 400, with body_error naming the defect
	CodeRequestTimeout   = "request_timeout"         // 408: the body did not arrive in time; retry with the same key
	CodeTenantMissing    = "tenant_missing"          // 401
	CodeInProgress       = "request_in_progress"     // 409, with Retry-After: retry with the same key
	CodeKeyReuse         = "idempotency_key_reuse"   // 422: the key belongs to another request
	CodeOutcomePending   = "outcome_pending"         // 409: an earlier attempt must be resolved; do not retry
	CodePayloadTooLarge  = "payload_too_large"       // 413
	CodeURITooLong       = "uri_too_long"            // 414, the endpoint is too long to store
	CodeStoreUnavailable = "store_unavailable"       // 503
	CodeClockBehind      = "clock_behind"            // 503, with Retry-After: the server's clock must be put right; retry with the same key
	CodeRateLimited      = "rate_limited"            // 429, with Retry-After: the tenant makes new keys too fast; nothing was stored
	CodeStoreFull        = "store_full"              // 507, with Retry-After: no room for new keys; nothing was stored

	// CodeResponseBodyOmitted answers a replay whose stored body was too
	// large to keep: 410, with the original status as original_status. The
	// operation ran; a retry gets the same answer and a new key runs it
	// again.
	CodeResponseBodyOmitted = "response_body_omitted"
	// CodeEncodingNotAcceptable answers a replay whose stored body has a
	// content coding that the retry's Accept-Encoding refuses and that
	// idem cannot decode (only gzip is decoded): 406, with
	// original_status. Retry with the same key, accepting that coding.
	CodeEncodingNotAcceptable = "encoding_not_acceptable"
	// CodeDecodedTooLarge answers a replay whose stored gzip body would
	// inflate beyond the bound a server decodes for a retry that refuses
	// gzip: 406, with original_status. Retry with the same key, accepting
	// gzip.
	CodeDecodedTooLarge = "decoded_body_too_large"
	// CodeReplayForbidden answers a retry whose credentials the server's
	// check before a replay refused (a revoked token): 403, and nothing of
	// the stored answer. Renew the credentials.
	CodeReplayForbidden = "replay_forbidden"
	// CodeReplayCheckFailed answers a retry whose credentials could not be
	// checked before a replay: 503 with Retry-After. Retry with the same
	// key.
	CodeReplayCheckFailed = "replay_check_failed"
)

// ClockBehindRetry is the delay a clock_behind answer asks for. A clock
// behind is usually put right by time synchronisation within seconds of
// the network coming up; a client that comes back sooner only gets the
// same answer.
const ClockBehindRetry = 5 * time.Second

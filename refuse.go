package idem

import (
	"errors"
	"time"
)

// Refusal is how a front end answers a request that Do did not run or
// whose outcome it could not store: a problem code, the words for the
// client, and how long the client should wait before it retries (0: a
// retry gets the same answer, or must not be made).
type Refusal struct {
	Code       string
	Detail     string
	RetryAfter time.Duration
}

// Refuse turns an error from Do that is not the operation's own into the
// contract's answer, worded for a client that sent a noun ("request",
// "call"). Each front end maps the code to its protocol's status; the
// words and the delays are the same everywhere. A store failure, and any
// error Refuse does not know, is store_unavailable.
func Refuse(err error, noun string) Refusal {
	var (
		ke *KeyError
		le *LimitError
	)
	switch {
	case errors.Is(err, ErrFingerprintMismatch):
		return Refusal{Code: CodeKeyReuse,
			Detail: "this idempotency key was used for a different " + noun + "; use a new key for a new operation"}
	case errors.Is(err, ErrInProgress) && errors.As(err, &ke):
		return Refusal{Code: CodeInProgress, RetryAfter: ke.RetryAfter,
			Detail: "a " + noun + " with this idempotency key is still being processed; retry with the same key"}
	case errors.Is(err, ErrOutcomePending) && errors.As(err, &ke) && ke.Reconciling:
		// The lease ran out and the store's reconciler picks the record up
		// on its next pass: the retry is worth making.
		return Refusal{Code: CodeInProgress, RetryAfter: ke.RetryAfter,
			Detail: "an earlier attempt with this idempotency key stopped before its outcome was recorded, and the service is finding out " +
				"what became of it; retry with the same key later: the retry gets that outcome once it is known"}
	case errors.Is(err, ErrOutcomePending):
		return Refusal{Code: CodeOutcomePending,
			Detail: "an earlier attempt with this idempotency key " + pendingOutcome(err) + "; every retry with this key gets this answer " +
				"until the service's operator resolves it (idem resolve). Do not send the " + noun + " under a new key: it would run again"}
	case errors.Is(err, ErrInvalidScope):
		return Refusal{Code: CodeKeyInvalid, Detail: err.Error()}
	case errors.Is(err, ErrClockBehind):
		return Refusal{Code: CodeClockBehind, RetryAfter: ClockBehindRetry,
			Detail: "the server's clock is behind the time its idempotency store last recorded, so nothing runs until the clock is right; retry with the same key"}
	case errors.Is(err, ErrRateLimited) && errors.As(err, &le):
		return Refusal{Code: CodeRateLimited, RetryAfter: le.RetryAfter,
			Detail: "too many " + noun + "s with new idempotency keys from this account; nothing was recorded: retry after the delay, with the same key"}
	case errors.Is(err, ErrStoreFull) && errors.As(err, &le):
		return Refusal{Code: CodeStoreFull, RetryAfter: le.RetryAfter,
			Detail: "the idempotency store has no room for new keys now; nothing was recorded: retry after the delay, with the same key"}
	case errors.Is(err, ErrNoTenant):
		return Refusal{Code: CodeTenantMissing,
			Detail: "the " + noun + " carries no credential this service accepts, so its idempotency key has no account to belong to; nothing was recorded"}
	case errors.Is(err, ErrOutcomeNotStored):
		return Refusal{Code: CodeStoreUnavailable, RetryAfter: time.Second,
			Detail: "the " + noun + " ran but its outcome could not be stored; retry with the same key, it will not run twice"}
	default:
		return Refusal{Code: CodeStoreUnavailable, RetryAfter: time.Second,
			Detail: "the idempotency store is unavailable; retry with the same key"}
	}
}

// storeFailure reports whether a claim's error is the store's failure
// rather than the contract's answer, and so worth logging.
func storeFailure(err error) bool {
	var ke *KeyError
	var le *LimitError
	return !errors.As(err, &ke) && !errors.As(err, &le) && !errors.Is(err, ErrInvalidScope) && !errors.Is(err, ErrClockBehind)
}

// pendingOutcome says what became of the earlier attempt behind an
// ErrOutcomePending refusal.
func pendingOutcome(err error) string {
	var ke *KeyError
	if errors.As(err, &ke) {
		switch ke.State {
		case StateFailed:
			return "failed, and the key stays spent"
		case StateInProgress:
			return "stopped before its outcome was recorded, so it may or may not have taken effect"
		}
	}
	return "may or may not have taken effect"
}

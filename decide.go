package idem

import (
	"fmt"
	"time"
)

// The defaults every store and the idem command share. A store's options
// fill a zero field with them.
const (
	// DefaultTTL is how long a record is kept after it is claimed.
	DefaultTTL = 24 * time.Hour
	// DefaultLease is how long a claim is held before it counts as
	// abandoned.
	DefaultLease = 30 * time.Second
	// DefaultMaxBodyBytes is the largest response body a store keeps for
	// replays; a larger one is omitted, its digest and length kept.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultSweepInterval is how often a store's background loop deletes
	// expired records and hands overdue claims to its reconciler.
	DefaultSweepInterval = time.Minute
)

// Decide is the contract's answer to a claim with fingerprint fp that
// finds the live record rec at now; every store asks it. It returns the
// event the claim counts and a nil error when rec is to be replayed, or
// the *KeyError that refuses the claim.
//
// The fingerprint comes first: a key reused for another request is
// refused for good, whatever state the first request is in. A record in
// progress under a live lease asks the caller to come back within a
// second or when the lease ends. A record whose outcome is not known
// (failed, unknown, or in progress past its lease) is pending; when the
// store hands overdue claims to a reconciler every reconcileEvery (0: it
// does not), an overdue claim says so in KeyError.Reconciling, with that
// period as its RetryAfter.
func Decide(rec *Record, fp Fingerprint, now time.Time, reconcileEvery time.Duration) (Event, error) {
	refuse := func(err error, retry time.Duration) *KeyError {
		return &KeyError{Err: err, State: rec.State, RetryAfter: retry, Tenant: rec.Scope.Tenant, Endpoint: rec.Scope.Endpoint}
	}
	switch {
	case rec.Fingerprint != fp:
		return EventMismatch, refuse(ErrFingerprintMismatch, 0)
	case rec.State == StateCompleted:
		return EventReplayed, nil
	case rec.State == StateInProgress && now.Before(rec.LeaseUntil):
		return EventConflict, refuse(ErrInProgress, min(time.Second, rec.LeaseUntil.Sub(now)))
	case rec.State == StateInProgress && reconcileEvery > 0:
		ke := refuse(ErrOutcomePending, reconcileEvery)
		ke.Reconciling = true
		return EventPending, ke
	default:
		return EventPending, refuse(ErrOutcomePending, 0)
	}
}

// CheckTakeOver is the rule for Operator.TakeOver, shared by every store:
// it returns nil when the live record rec may get a new lease at now, and
// otherwise why not. A completed record never may (ErrCompleted), nor one
// whose lease is still running (a *KeyError with ErrInProgress, retrying
// when the lease ends); failed, unknown and overdue records may.
func CheckTakeOver(rec *Record, now time.Time) error {
	switch {
	case rec.State == StateCompleted:
		return fmt.Errorf("%w (tenant %q, endpoint %q)", ErrCompleted, rec.Scope.Tenant, rec.Scope.Endpoint)
	case rec.State == StateInProgress && now.Before(rec.LeaseUntil):
		return &KeyError{Err: ErrInProgress, State: rec.State, RetryAfter: rec.LeaseUntil.Sub(now),
			Tenant: rec.Scope.Tenant, Endpoint: rec.Scope.Endpoint}
	}
	return nil
}

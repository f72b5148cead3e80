package idem

import (
	"errors"
	"fmt"
	"time"
)

// Errors that callers match with errors.Is. Refusals of a claim arrive
// wrapped in a *KeyError that also carries the record's state.
var (
	// ErrInProgress: another caller holds a live lease on the key. Retry
	// after KeyError.RetryAfter with the same key.
	ErrInProgress = errors.New("idem: request in progress")
	// ErrFingerprintMismatch: the key was first used with a different
	// request. Permanent: the client must use a new key.
	ErrFingerprintMismatch = errors.New("idem: idempotency key reused with a different request")
	// ErrOutcomePending: an earlier attempt failed or may have taken effect
	// (failed, unknown, or in progress past its lease) and nobody has
	// resolved it yet. Retrying does not help until it is resolved.
	ErrOutcomePending = errors.New("idem: outcome of an earlier attempt is pending")
	// ErrLeaseLost: the lease was resolved or taken over by someone else,
	// so this holder may no longer change the record.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrNotFound: no live record exists for the scope.
	ErrNotFound = errors.New("idem: record not found")
	// ErrCompleted: the record already holds a response, which is never
	// overwritten; returned by TakeOver.
	ErrCompleted = errors.New("idem: record already completed")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("idem: database closed")
	// ErrInvalidScope: the tenant, endpoint or key is empty or too long.
	ErrInvalidScope = errors.New("idem: invalid scope")
	// ErrInvalidResponse: a response to store is out of range (status
	// outside 100-999).
	ErrInvalidResponse = errors.New("idem: invalid response")
	// ErrInvalidOptions: a store's or a component's options failed
	// validation.
	ErrInvalidOptions = errors.New("idem: invalid options")
	// ErrCorrupt: a stored value or the schema marker cannot be decoded.
	ErrCorrupt = errors.New("idem: corrupt record")
	// ErrClockBehind: the clock reads further behind the newest time the
	// store has written under than the store tolerates, so a claim now
	// would write a record that expires, and a lease that ends, too early
	// once the clock is right. Nothing was stored. Retry once the clock
	// is right.
	ErrClockBehind = errors.New("idem: clock is behind the store's newest time")
	// ErrNoTenant: the front end's Tenant function refused the request,
	// which then has nothing to scope its key by. Its own error, which
	// may tell of the service's internals, is logged and never sent.
	ErrNoTenant = errors.New("idem: no tenant for the request")
)

// KeyError is the error a claim gets when the key is already taken. Err is
// one of ErrInProgress, ErrFingerprintMismatch or ErrOutcomePending.
type KeyError struct {
	Err error
	// State is the stored record's state.
	State State
	// RetryAfter is how long a caller should wait before retrying: set for
	// ErrInProgress, and for ErrOutcomePending while Reconciling.
	RetryAfter time.Duration
	// Reconciling says that the record is in progress past its lease and
	// that the store hands such claims to a reconciler, which may settle
	// it within RetryAfter; a front end then asks the client to retry
	// rather than to wait for an operator.
	Reconciling bool
	// Tenant and Endpoint say where the key lives; the key itself is left
	// out because error strings end up in logs.
	Tenant, Endpoint string
}

func (e *KeyError) Error() string {
	msg := fmt.Sprintf("%v (tenant %q, endpoint %q, state %s", e.Err, e.Tenant, e.Endpoint, e.State)
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(", retry after %s", e.RetryAfter)
	}
	return msg + ")"
}

func (e *KeyError) Unwrap() error { return e.Err }

// MinTTLLeases is how many leases a store's TTL spans at least: a record
// must outlive every retry of an operation, and an operation may hold its
// lease for a while, so a TTL close to the lease would let a key expire
// under a client that is still retrying.
const MinTTLLeases = 10

// CheckTTLs applies the TTL rule to a store's TTL and to each of its
// endpoints' TTLs, given the lease: each must be positive and at least
// MinTTLLeases leases. Its error names every TTL that breaks the rule and
// matches ErrInvalidOptions.
func CheckTTLs(ttl time.Duration, endpointTTL map[string]time.Duration, lease time.Duration) error {
	check := func(name string, ttl time.Duration) error {
		switch {
		case ttl <= 0:
			return fmt.Errorf("%w: %s %s must be positive", ErrInvalidOptions, name, ttl)
		case lease > 0 && ttl < MinTTLLeases*lease:
			return fmt.Errorf("%w: %s %s must be at least %d leases (%s)", ErrInvalidOptions, name, ttl, MinTTLLeases, MinTTLLeases*lease)
		}
		return nil
	}
	errs := []error{check("TTL", ttl)}
	for ep, d := range endpointTTL {
		errs = append(errs, check(fmt.Sprintf("EndpointTTL[%q]", ep), d))
	}
	return errors.Join(errs...)
}

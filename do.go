package idem

import (
	"context"
	"errors"
	"fmt"
)

// ErrNoEffect is what an operation run by Do returns (wrapped, or as is)
// when it provably took no effect, so that Do releases the key and a retry
// runs the operation again.
var ErrNoEffect = errors.New("idem: operation took no effect")

// Do runs fn at most once for the operation that s and fp name, under a
// claim on store, and records its outcome: the managed form of Claim and
// Lease, as the HTTP middleware uses them.
//
//   - A key completed with the same fingerprint is not run again: Do
//     returns the stored response with replayed set.
//   - A refused claim returns the *KeyError (ErrInProgress,
//     ErrFingerprintMismatch, ErrOutcomePending), and any store error as
//     it is; fn does not run.
//   - Otherwise fn runs with the lease, which it may Extend during a long
//     operation but must not end. When fn returns a nil error its response
//     is completed and returned. An error matching ErrNoEffect releases the
//     key; any other error, and a panic, record the outcome as unknown, so
//     retries get ErrOutcomePending until someone reconciles it. The panic
//     is then raised again.
//
// The outcome is recorded on a context that ctx's cancellation does not
// reach: a caller that gives up must not leave the record in progress. When
// recording fails, Do returns that error and not the response: the
// operation ran, but what a retry would find is the record in progress, so
// handing out the response would let the caller hold what a retry cannot
// get back.
func Do(ctx context.Context, store Store, s Scope, fp Fingerprint,
	fn func(ctx context.Context, l Lease) (Response, error)) (resp Response, replayed bool, err error) {
	l, rec, err := store.Claim(ctx, s, fp)
	switch {
	case err != nil:
		return Response{}, false, err
	case rec != nil:
		return rec.Response, true, nil
	}
	keep := context.WithoutCancel(ctx)
	returned := false
	defer func() {
		if returned {
			return
		}
		p := recover()
		_ = l.MarkUnknown(keep)
		if p != nil {
			panic(p)
		}
	}()
	resp, runErr := fn(ctx, l)
	returned = true
	switch {
	case runErr == nil:
		if err := l.Complete(keep, resp); err != nil {
			return Response{}, false, fmt.Errorf("idem: the operation ran but its outcome was not stored: %w", err)
		}
		return resp, false, nil
	case errors.Is(runErr, ErrNoEffect):
		if err := l.Release(keep); err != nil {
			return Response{}, false, errors.Join(runErr, err)
		}
	default:
		if err := l.MarkUnknown(keep); err != nil {
			return Response{}, false, errors.Join(runErr, err)
		}
	}
	return Response{}, false, runErr
}

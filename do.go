package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ErrNoEffect is what an operation run by Do returns (wrapped, or as is)
// when it provably took no effect, so that Do releases the key and a retry
// runs the operation again.
var ErrNoEffect = errors.New("idem: operation took no effect")

// ErrOutcomeNotStored is what Do returns when the operation ran but its
// response could not be completed in the store. The record stays in
// progress until its lease ends and then reads as pending: a retry never
// runs the operation again, and the response must not reach the caller,
// who would hold what a retry cannot get back.
var ErrOutcomeNotStored = errors.New("idem: the operation ran but its outcome was not stored")

// DoOptions tunes Do. A nil *DoOptions is the zero value: no waiting, and
// logging to slog.Default.
type DoOptions struct {
	// Wait is how long a claim that finds the key in progress waits for
	// that attempt to end, watching the record with Store.Wait, before it
	// is refused; when the record changes in time the claim is made once
	// more and answers what it finds. 0 refuses at once.
	Wait time.Duration
	// Logger receives store failures: a claim the store could not make, and
	// an outcome it could not record (the record then stays in progress
	// until someone reconciles it).
	Logger *slog.Logger
}

// Result is Do's answer when the key was Do's to answer.
type Result struct {
	// Response is what the operation answered, or the stored response of a
	// replay.
	Response Response
	// Replayed is the record a replay answered from, nil when the
	// operation ran. Its BodyOmitted says that Response has no body
	// because the original was too large to keep.
	Replayed *Record
}

// Do runs fn at most once for the operation that s and fp name, under a
// claim on store, and records its outcome: the sequence that idemhttp and
// idemgrpc answer every request with.
//
//   - A key completed with the same fingerprint is not run again: Do
//     returns its record in Result.Replayed.
//   - A refused claim returns the *KeyError (ErrInProgress,
//     ErrFingerprintMismatch, ErrOutcomePending), and any store error as
//     it is; fn does not run. Refuse says how to answer such an error.
//   - Otherwise fn runs with the lease, which it may Extend during a long
//     operation but must not end. When fn returns a nil error its response
//     is completed and returned. An error matching ErrNoEffect releases the
//     key; any other error, and a panic, record the outcome as unknown, so
//     retries get ErrOutcomePending until someone reconciles it. Do returns
//     fn's error (joined with the store's when recording failed), and
//     raises a panic again.
//
// The outcome is recorded on a context that ctx's cancellation does not
// reach: a caller that gives up must not leave the record in progress.
// When completing fails, Do returns ErrOutcomeNotStored and not the
// response.
func Do(ctx context.Context, store Store, s Scope, fp Fingerprint, opts *DoOptions,
	fn func(ctx context.Context, l Lease) (Response, error)) (Result, error) {
	var o DoOptions
	if opts != nil {
		o = *opts
	}
	if o.Wait < 0 {
		return Result{}, fmt.Errorf("%w: DoOptions.Wait %s must not be negative", ErrInvalidOptions, o.Wait)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	l, rec, err := store.Claim(ctx, s, fp)
	if errors.Is(err, ErrInProgress) && o.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, o.Wait)
		werr := store.Wait(wctx, s)
		cancel()
		if werr == nil {
			l, rec, err = store.Claim(ctx, s, fp)
		}
	}
	switch {
	case err != nil:
		if storeFailure(err) && ctx.Err() == nil {
			o.Logger.Error("idem: claim failed", "tenant", s.Tenant, "endpoint", s.Endpoint, "err", err)
		}
		return Result{}, err
	case rec != nil:
		return Result{Response: rec.Response, Replayed: rec}, nil
	}
	// settled logs an outcome the store could not record: the record stays
	// in progress and is found by reconciliation, never re-run blindly.
	settled := func(err error) error {
		if err != nil {
			o.Logger.Error("idem: storing the outcome failed; the record stays in progress until reconciled",
				"tenant", s.Tenant, "endpoint", s.Endpoint, "key_hash", KeyHash(s.Key), "err", err)
		}
		return err
	}
	keep := context.WithoutCancel(ctx)
	returned := false
	defer func() {
		if returned {
			return
		}
		// fn panicked, or ended its goroutine (runtime.Goexit), after it
		// may have done anything.
		p := recover()
		settled(l.MarkUnknown(keep))
		if p != nil {
			panic(p)
		}
	}()
	resp, runErr := fn(ctx, l)
	returned = true
	switch {
	case runErr == nil:
		if err := settled(l.Complete(keep, resp)); err != nil {
			return Result{}, fmt.Errorf("%w: %w", ErrOutcomeNotStored, err)
		}
		return Result{Response: resp}, nil
	case errors.Is(runErr, ErrNoEffect):
		err = settled(l.Release(keep))
	default:
		err = settled(l.MarkUnknown(keep))
	}
	if err != nil {
		return Result{}, errors.Join(runErr, err)
	}
	return Result{}, runErr
}

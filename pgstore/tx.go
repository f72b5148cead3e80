package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idemkv/idem"
)

// ClaimTx claims the key in sc inside tx, a transaction the caller began
// on the store's database, so that the operation's own writes and its
// outcome commit together. It answers as Claim does: a lease when the key
// is the caller's, the record to replay, or a *idem.KeyError; exactly
// one of them is non-nil.
//
// The lease's calls run on tx, and nothing the claim and the lease write
// is visible to anyone else before tx commits. Until then a concurrent
// claim of the same key waits for tx to end, at most Options.ClaimWait,
// and gets the replay if tx committed a completion, the key if tx rolled
// back, and ErrInProgress if tx is still open. A rollback leaves no trace:
// the key is free and a retry runs the operation again. A commit makes
// the operation's rows and the completed record visible at once, so no
// one ever sees the operation done and the key in progress. Waiters are
// woken when tx commits; Wait does not see the claim of a transaction
// still open and returns at once, leaving the wait to the next claim.
//
// End the lease before committing: Complete stores the response, and
// Release deletes the claim while keeping tx's other writes. A commit
// with the lease still held leaves the record in progress, as a crashed
// holder would, for reconciliation once the lease ends. MarkUnknown,
// MarkFailed and Extend work as on a Store's lease.
//
// The claim runs under a savepoint, so tx stays usable after a refusal
// or an error, unless the connection itself failed; tx's lock_timeout is
// left as it was. A replay or a refusal leaves no lock in tx: the
// record's holder and other claims of the key go on as if tx were not
// there. Like tx, the lease is not safe for use concurrently
// with other statements on tx. Events are counted when each call runs,
// even if tx then rolls back.
//
// All this holds at read committed, PostgreSQL's default isolation. At
// repeatable read or serializable, a key that another transaction
// committed after tx took its snapshot is a serialization failure
// (SQLSTATE 40001, in a *pgconn.PgError): roll back and start over.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, sc idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	if tx == nil {
		return nil, nil, errors.New("pgstore: ClaimTx needs a transaction")
	}
	l, rec, err := s.claim(ctx, tx, sc, fp)
	if l == nil {
		return nil, rec, err // not a nil *lease in a non-nil interface
	}
	return l, nil, nil
}

// InTx runs fn in one transaction with the claim of the key in sc and the
// completion of fn's response, so that the operation's writes commit at
// most once: the managed form of ClaimTx, which most callers want. It
// begins a transaction on the store's pool, claims the key in it and
// then:
//
//   - returns the stored response with replayed set when the key was
//     completed with the same fingerprint, without running fn;
//   - returns the *idem.KeyError of a refused claim, or any store
//     error, without running fn;
//   - otherwise runs fn with the transaction, in which fn writes the
//     operation's rows. When fn returns a nil error, its response is
//     completed in the transaction, the transaction commits, and the
//     response is returned. When fn returns an error or panics, or its
//     response cannot be stored (idem.ErrInvalidResponse), the
//     transaction rolls back, the key stays free and the error is
//     returned (the panic raised again).
//
// An error from the commit means the outcome is not known here, but it
// is whole: either the rows and the completed record were both
// committed, and a retry gets the replay, or neither was, and a retry
// runs fn again. fn must not commit or roll back the transaction, nor
// keep it after it returns. See ClaimTx for what concurrent claims of
// the key see meanwhile.
func (s *Store) InTx(ctx context.Context, sc idem.Scope, fp idem.Fingerprint,
	fn func(ctx context.Context, tx pgx.Tx) (idem.Response, error)) (resp idem.Response, replayed bool, err error) {
	if err := validate(sc); err != nil {
		return idem.Response{}, false, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Response{}, false, err
	}
	if err := s.enter(); err != nil {
		return idem.Response{}, false, err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return idem.Response{}, false, s.fail("begin", err)
	}
	// After a commit the rollback does nothing; otherwise it undoes the
	// claim and fn's writes, whatever returned or panicked.
	defer tx.Rollback(context.WithoutCancel(ctx))
	l, rec, err := s.ClaimTx(ctx, tx, sc, fp)
	switch {
	case err != nil:
		return idem.Response{}, false, err
	case rec != nil:
		return rec.Response, true, nil
	}
	resp, err = fn(ctx, tx)
	if err != nil {
		return idem.Response{}, false, err
	}
	if err := l.Complete(ctx, resp); err != nil {
		return idem.Response{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return idem.Response{}, false, s.fail("commit", err)
	}
	return resp, false, nil
}

package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkv/idem"
)

// lease is a Store's idem.Lease. Every call names the lease's token in
// its WHERE, so it changes the record only while the record is in
// progress, unexpired and still this lease's: any other writer (a
// take-over, a new claim after a release or after expiry) changed the
// token or the state.
type lease struct {
	s     *Store
	q     querier // the pool, or the caller's transaction for ClaimTx
	scope idem.Scope
	token []byte
	start time.Time // when the lease was granted, for event latencies

	// mu serializes the calls and guards rec.
	mu  sync.Mutex
	rec idem.Record // the record as this lease last wrote it
}

func (l *lease) Scope() idem.Scope { return l.scope }

func (l *lease) Record() idem.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return cloneRecord(l.rec)
}

// mine is the WHERE of every lease call: $1-$3 the scope, $4 the token,
// $5 now.
const mine = `tenant = $1 AND endpoint = $2 AND idem_key = $3
	AND lease_token = $4 AND state = 1 AND expires_at > $5`

// settleSQL ends a lease with a state ($6) and, for a completion, a
// response ($7-$12), and announces it to waiters ($13, $14) in the same
// statement when the record says someone waits (see waitSQL). It returns
// nothing of the record: the lease knows what it wrote.
const settleSQL = `
WITH u AS (
	UPDATE {keys} SET state = $6, response_status = $7, response_headers = $8,
		response_body = $9, body_len = $10, body_digest = $11, body_omitted = $12,
		lease_until = $5, updated_at = $5
	WHERE ` + mine + `
	RETURNING waiting
)
SELECT CASE WHEN u.waiting THEN pg_notify($13, $14) END FROM u`

const releaseSQL = `
WITH d AS (DELETE FROM {keys} WHERE ` + mine + ` RETURNING waiting)
SELECT CASE WHEN d.waiting THEN pg_notify($6, $7) END FROM d`

const extendSQL = `
UPDATE {keys} SET lease_until = $6, updated_at = $5
WHERE ` + mine + `
RETURNING ` + columns

// Complete stores resp, keeping a body up to Options.MaxBodyBytes and
// only its length and digest beyond that.
func (l *lease) Complete(ctx context.Context, resp idem.Response) error {
	if err := resp.Check(); err != nil {
		return err
	}
	hdr, err := encodeHeader(resp.Header)
	if err != nil {
		return fmt.Errorf("%w: headers: %v", idem.ErrInvalidResponse, err)
	}
	out := idem.Record{State: idem.StateCompleted, Response: resp,
		BodyLen: int64(len(resp.Body)), BodyDigest: sha256.Sum256(resp.Body)}
	out.BodyOmitted = out.BodyLen > l.s.opts.MaxBodyBytes
	if out.BodyOmitted {
		out.Response.Body = nil
	}
	return l.settle(ctx, out, idem.EventCompleted, int32(resp.Status), hdr, out.BodyDigest[:])
}

func (l *lease) MarkUnknown(ctx context.Context) error {
	return l.settle(ctx, idem.Record{State: idem.StateUnknown}, idem.EventUnknown, nil, nil, nil)
}

func (l *lease) MarkFailed(ctx context.Context) error {
	return l.settle(ctx, idem.Record{State: idem.StateFailed}, idem.EventFailed, nil, nil, nil)
}

// settle moves the record out of progress into out's state, with out's
// response and body fields; status, hdr and digest are those fields as
// the statement takes them, nil for none.
func (l *lease) settle(ctx context.Context, out idem.Record, e idem.Event, status, hdr any, digest []byte) error {
	body := out.Response.Body
	if len(body) == 0 {
		body = nil
	}
	return l.call(ctx, func(now time.Time) error {
		tag, err := l.q.Exec(ctx, l.s.sql.settle, l.scope.Tenant, l.scope.Endpoint, l.scope.Key, l.token, now,
			int16(out.State), status, hdr, body, out.BodyLen, digest, out.BodyOmitted, notifyChannel, scopeTag(l.scope))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return pgx.ErrNoRows
		}
		rec := l.rec
		rec.State, rec.Response, rec.LeaseUntil, rec.UpdatedAt = out.State, out.Response, now, now
		rec.BodyLen, rec.BodyDigest, rec.BodyOmitted = out.BodyLen, out.BodyDigest, out.BodyOmitted
		l.rec = cloneRecord(rec)
		l.s.note(e, &l.rec, l.start)
		return nil
	})
}

// Release deletes the record, freeing the key.
func (l *lease) Release(ctx context.Context) error {
	return l.call(ctx, func(now time.Time) error {
		tag, err := l.q.Exec(ctx, l.s.sql.release, l.scope.Tenant, l.scope.Endpoint, l.scope.Key, l.token, now,
			notifyChannel, scopeTag(l.scope))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return pgx.ErrNoRows
		}
		l.rec = idem.Record{Scope: l.scope, Fingerprint: l.rec.Fingerprint}
		l.s.note(idem.EventReleased, &l.rec, l.start)
		return nil
	})
}

// Extend pushes the end of the lease one Options.Lease from now.
func (l *lease) Extend(ctx context.Context) error {
	return l.call(ctx, func(now time.Time) error {
		r, err := scanRecord(l.q.QueryRow(ctx, l.s.sql.extend, l.scope.Tenant, l.scope.Endpoint, l.scope.Key, l.token, now,
			l.s.leaseEnd(now)))
		if err != nil {
			return err
		}
		l.rec = r.rec
		return nil
	})
}

// call runs one lease call under mu once ctx and the store allow it. A
// statement that matches no row means the record is no longer this
// lease's: ErrLeaseLost.
func (l *lease) call(ctx context.Context, fn func(now time.Time) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.s.enter(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	err := fn(l.s.now())
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return idem.ErrLeaseLost
	default:
		return l.s.fail("lease", err)
	}
}

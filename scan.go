package idem

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem/internal/keys"
)

// Filter selects records for DB.Records. Each zero field selects
// everything.
type Filter struct {
	// Tenant keeps one tenant's records, and Endpoint, given with Tenant,
	// one of its endpoints. Both read only their span of the store. An
	// Endpoint without a Tenant is matched record by record.
	Tenant, Endpoint string
	// State keeps the records in that state.
	State State
	// CreatedBefore keeps the records claimed before it.
	CreatedBefore time.Time
	// Expired keeps the records past their TTL as well, which every other
	// read treats as absent; the sweeper has not deleted them yet.
	Expired bool
}

func (f Filter) match(rec *Record, now time.Time) bool {
	return (f.Endpoint == "" || rec.Scope.Endpoint == f.Endpoint) &&
		(f.State == 0 || rec.State == f.State) &&
		(f.CreatedBefore.IsZero() || rec.CreatedAt.Before(f.CreatedBefore)) &&
		(f.Expired || now.Before(rec.ExpiresAt))
}

// Records returns the records f selects, for listings and operator tools,
// in the store's order: by tenant, then endpoint, then key, each compared
// by length first and then bytewise. Each record has its scope;
// bodies stored inside the record are included, overflow bodies are not
// read (Response.Body is nil, BodyLen says how long it is): use Get for
// one record in full.
//
// It reads the store as it is, without the per-key locks, so a write whose
// sync has not finished may show. The sequence ends after yielding an error.
// Close waits until the loop over it ends, so the loop must not call Close.
func (db *DB) Records(ctx context.Context, f Filter) iter.Seq2[*Record, error] {
	return func(yield func(*Record, error) bool) {
		if err := db.enter(); err != nil {
			yield(nil, err)
			return
		}
		defer db.exit()
		var parts []string
		if f.Tenant != "" {
			parts = append(parts, f.Tenant)
			if f.Endpoint != "" {
				parts = append(parts, f.Endpoint)
			}
		}
		lo, hi := keys.RecordSpan(parts...)
		it, err := db.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			yield(nil, fmt.Errorf("idem: list records: %w", err))
			return
		}
		now := db.now()
		for ok := it.First(); ok; ok = it.Next() {
			if err := ctx.Err(); err != nil {
				yield(nil, errors.Join(err, it.Close()))
				return
			}
			v, err := it.ValueAndErr()
			var rec *Record
			if err == nil {
				rec, err = decodeRecord(v)
			}
			if err == nil {
				rec.Scope.Tenant, rec.Scope.Endpoint, rec.Scope.Key, err = keys.ParseRecord(it.Key())
			}
			if err != nil {
				yield(nil, errors.Join(fmt.Errorf("idem: list records: %w", err), it.Close()))
				return
			}
			if f.match(rec, now) && !yield(rec, nil) {
				it.Close()
				return
			}
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			yield(nil, fmt.Errorf("idem: list records: %w", err))
		}
	}
}

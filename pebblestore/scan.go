package pebblestore

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
)

// Records returns the records f selects, as idem.Operator.Records says,
// in the store's order: by tenant, then endpoint, then key, each compared
// by length first and then bytewise. A Tenant, or a Tenant and an
// Endpoint, read only their span of the store; an Endpoint alone is
// matched record by record. Bodies stored inside the record are included,
// overflow bodies are not read.
//
// It reads the store as it is, without the per-key locks, so a write whose
// sync has not finished may show. The sequence ends after yielding an error.
// Close waits until the loop over it ends, so the loop must not call Close.
func (db *Store) Records(ctx context.Context, f idem.Filter) iter.Seq2[*idem.Record, error] {
	return func(yield func(*idem.Record, error) bool) {
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
			var rec *record.Stored
			if err == nil {
				rec, err = record.Decode(v)
			}
			if err == nil {
				rec.Scope.Tenant, rec.Scope.Endpoint, rec.Scope.Key, err = keys.ParseRecord(it.Key())
			}
			if err != nil {
				yield(nil, errors.Join(fmt.Errorf("idem: list records: %w", err), it.Close()))
				return
			}
			if f.Match(&rec.Record, now) && !yield(&rec.Record, nil) {
				it.Close()
				return
			}
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			yield(nil, fmt.Errorf("idem: list records: %w", err))
		}
	}
}

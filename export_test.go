package idem

import (
	"bytes"
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/record"
)

// CheckConsistency walks every key family and reports the first broken
// link between a record and its index entries or body chunks: what a crash
// must never leave behind.
func (db *DB) CheckConsistency() error {
	records := map[string]*record.Stored{}
	seen := map[string]bool{}
	err := db.scanFamily(keys.TagRecord, func(k, v []byte) error {
		rec, err := record.Decode(v)
		if err != nil {
			return fmt.Errorf("record %x: %w", k, err)
		}
		if _, _, _, err := keys.ParseRecord(k); err != nil {
			return fmt.Errorf("record key %x: %w", k, err)
		}
		records[string(k)] = rec
		return nil
	})
	if err != nil {
		return err
	}
	for _, tag := range []byte{keys.TagExpiry, keys.TagPending} {
		err := db.scanFamily(tag, func(k, v []byte) error {
			t, rk, err := keys.ParseIndex(k)
			if err != nil {
				return err
			}
			rec := records[string(rk)]
			switch {
			case rec == nil:
				return fmt.Errorf("%c entry %x points to no record", tag, k)
			case tag == keys.TagExpiry && t != rec.ExpiresAt.UnixNano():
				return fmt.Errorf("stale expiry entry %x", k)
			case tag == keys.TagPending && (t != rec.LeaseUntil.UnixNano() || rec.State == StateCompleted):
				return fmt.Errorf("stale pending entry %x", k)
			}
			seen[string([]byte{tag})+string(rk)] = true
			return nil
		})
		if err != nil {
			return err
		}
	}
	chunks := map[string]uint32{}
	err = db.scanFamily(keys.TagBody, func(k, v []byte) error {
		rk := k[1 : len(k)-4]
		if records[string(rk)] == nil {
			return fmt.Errorf("body chunk %x belongs to no record", k)
		}
		chunks[string(rk)]++
		return nil
	})
	if err != nil {
		return err
	}
	for rk, rec := range records {
		if !seen["x"+rk] {
			return fmt.Errorf("record %x has no expiry entry", rk)
		}
		if rec.State != StateCompleted && !seen["p"+rk] {
			return fmt.Errorf("record %x (%s) has no pending entry", rk, rec.State)
		}
		if chunks[rk] != rec.Chunks {
			return fmt.Errorf("record %x has %d chunks, expects %d", rk, chunks[rk], rec.Chunks)
		}
	}
	return nil
}

func (db *DB) scanFamily(tag byte, fn func(k, v []byte) error) error {
	lo, hi := keys.FamilySpan(tag)
	it, err := db.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(bytes.Clone(it.Key()), bytes.Clone(it.Value())); err != nil {
			return err
		}
	}
	return it.Error()
}

// CountFamily returns how many live keys of family tag the store holds.
func (db *DB) CountFamily(tag byte) (int, error) {
	n := 0
	err := db.scanFamily(tag, func(k, v []byte) error { n++; return nil })
	return n, err
}

// FlushMemtable writes what the memtable holds to a table, so that a test
// can put two writes of one key in different tables.
func (db *DB) FlushMemtable() error { return db.pdb.Flush() }

// CompactStore compacts every key down to the last level.
func (db *DB) CompactStore() error {
	return db.pdb.Compact(context.Background(), []byte{0}, []byte{0xff}, false)
}

// TableDeletions returns how many point deletions the store's tables hold.
func (db *DB) TableDeletions() (uint64, error) {
	levels, err := db.pdb.SSTables(pebble.WithProperties())
	var n uint64
	for _, tables := range levels {
		for _, t := range tables {
			n += t.Properties.NumDeletions
		}
	}
	return n, err
}

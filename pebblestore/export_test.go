package pebblestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem/internal/keys"
)

// RequireConsistent fails t, listing every problem, unless Check finds db
// sound.
func RequireConsistent(t testing.TB, db *Store, msgAndArgs ...any) {
	t.Helper()
	res, err := db.Check(context.Background())
	require.NoError(t, err, msgAndArgs...)
	var problems []string
	for _, p := range res.Problems {
		problems = append(problems, p.String())
	}
	require.Empty(t, problems, msgAndArgs...)
}

func (db *Store) scanFamily(tag byte, fn func(k, v []byte) error) error {
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
func (db *Store) CountFamily(tag byte) (int, error) {
	n := 0
	err := db.scanFamily(tag, func(k, v []byte) error { n++; return nil })
	return n, err
}

// FlushMemtable writes what the memtable holds to a table, so that a test
// can put two writes of one key in different tables.
func (db *Store) FlushMemtable() error { return db.pdb.Flush() }

// CompactStore compacts every key down to the last level.
func (db *Store) CompactStore() error {
	return db.pdb.Compact(context.Background(), []byte{0}, []byte{0xff}, false)
}

// TableDeletions returns how many point deletions the store's tables hold.
func (db *Store) TableDeletions() (uint64, error) {
	levels, err := db.pdb.SSTables(pebble.WithProperties())
	var n uint64
	for _, tables := range levels {
		for _, t := range tables {
			n += t.Properties.NumDeletions
		}
	}
	return n, err
}

// StoredClockMark returns the clock mark as the store holds it on disk,
// and whether it holds one.
func (db *Store) StoredClockMark() (time.Time, bool, error) {
	v, closer, err := db.pdb.Get(keys.Clock)
	if errors.Is(err, pebble.ErrNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	defer closer.Close()
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), true, nil
}

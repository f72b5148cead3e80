package pebblestore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// TestIndexesHoldThroughFlushesAndCompactions runs random sequences of
// every operation that writes a record, on a few keys and a clock that
// often does not move (so that a write may keep a pending entry's key),
// with flushes and compactions in between, and checks after each of those
// and at the end that every index entry matches its record. Pending
// entries are retired with single deletions, which go wrong only when a
// deletion and the sets it meets end up in different tables: this is
// where that would show.
func TestIndexesHoldThroughFlushesAndCompactions(t *testing.T) {
	const sequences, steps = 30, 400
	for seq := range sequences {
		seed := uint64(time.Now().UnixNano()) + uint64(seq)
		if !t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			runIndexSequence(t, rand.New(rand.NewPCG(seed, 3)).IntN, steps)
		}) {
			break
		}
	}
}

// FuzzIndexes runs the same sequences with every choice taken from the
// fuzzer's bytes, so that coverage steers which operations meet which
// flushes and compactions.
func FuzzIndexes(f *testing.F) {
	f.Add([]byte{0, 0, 1, 8, 0, 3, 0, 10, 3, 0, 11, 4, 0, 0, 10, 11})
	f.Add([]byte{0, 1, 0, 8, 6, 6, 0, 9, 2, 0, 4, 1, 11, 5, 2, 10})
	f.Fuzz(func(t *testing.T, choices []byte) {
		if len(choices) > 4096 {
			return
		}
		// A choice past the end is 0, a claim; the run ends with the bytes.
		intn := func(n int) int {
			if len(choices) == 0 {
				return 0
			}
			c := int(choices[0]) % n
			choices = choices[1:]
			return c
		}
		runIndexSequence(t, intn, len(choices)/2)
	})
}

// runIndexSequence takes every choice from intn, which returns a number
// in [0, n).
func runIndexSequence(t *testing.T, intn func(n int) int, steps int) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	db, err := Open("db", &Options{
		fs: vfs.NewMem(), SweepInterval: -1, Lease: 10 * time.Second, TTL: 100 * time.Second,
		InlineBodyBytes: 16, Now: func() time.Time { return now },
	})
	require.NoError(t, err)
	defer db.Close()

	scopes := []idem.Scope{{Tenant: "a", Endpoint: "POST /x", Key: "k1"}, {Tenant: "a", Endpoint: "POST /x", Key: "k2"}, {Tenant: "b", Endpoint: "POST /x", Key: "k1"}}
	prints := []idem.Fingerprint{sha256.Sum256([]byte("one")), sha256.Sum256([]byte("two"))}
	var leases []idem.Lease
	lease := func() idem.Lease {
		if len(leases) == 0 {
			return nil
		}
		return leases[intn(len(leases))]
	}
	// expected lists the refusals a step may meet; anything else fails.
	expected := func(err error) bool {
		for _, e := range []error{idem.ErrInProgress, idem.ErrFingerprintMismatch, idem.ErrOutcomePending, idem.ErrLeaseLost, idem.ErrNotFound, idem.ErrCompleted} {
			if errors.Is(err, e) {
				return true
			}
		}
		return err == nil
	}
	check := func(step int, what string) {
		RequireConsistent(t, db, "after step %d (%s)", step, what)
	}
	for step := range steps {
		var err error
		var what string
		switch op := intn(12); {
		case op < 2:
			what = "claim"
			var l idem.Lease
			l, _, err = db.Claim(ctx, scopes[intn(len(scopes))], prints[intn(len(prints))])
			if l != nil {
				leases = append(leases, l)
			}
		case op == 2:
			what = "take over"
			var l idem.Lease
			l, err = db.TakeOver(ctx, scopes[intn(len(scopes))])
			if l != nil {
				leases = append(leases, l)
			}
		case op < 8:
			l := lease()
			if l == nil {
				continue
			}
			switch op {
			case 3:
				what, err = "extend", l.Extend(ctx)
			case 4:
				body := make([]byte, intn(40))
				what, err = "complete", l.Complete(ctx, idem.Response{Status: 201, Body: body})
			case 5:
				what, err = "release", l.Release(ctx)
			case 6:
				what, err = "mark unknown", l.MarkUnknown(ctx)
			default:
				what, err = "mark failed", l.MarkFailed(ctx)
			}
		case op == 8:
			// Mostly no time at all, so that writes keep their keys.
			what = "advance"
			now = now.Add([]time.Duration{0, 0, 0, time.Nanosecond, time.Second, 11 * time.Second, 101 * time.Second}[intn(7)])
		case op == 9:
			what = "sweep"
			_, err = db.Sweep(ctx)
		case op == 10:
			what, err = "flush", db.FlushMemtable()
			require.NoError(t, err)
			check(step, what)
		default:
			what, err = "compact", db.CompactStore()
			require.NoError(t, err)
			check(step, what)
		}
		require.True(t, expected(err), "step %d (%s): %v", step, what, err)
	}
	require.NoError(t, db.CompactStore())
	check(steps, "final compaction")
}

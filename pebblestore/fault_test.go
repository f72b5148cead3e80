package pebblestore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// faults injects errorfs.ErrInjected into the operations match selects,
// while it is switched on, and switches itself off after limit faults when
// limit is positive.
type faults struct {
	on       atomic.Bool
	match    func(errorfs.Op) bool
	limit    int64
	injected atomic.Int64
}

func (f *faults) MaybeError(op errorfs.Op) error {
	if !f.on.Load() || !f.match(op) {
		return nil
	}
	if n := f.injected.Add(1); f.limit > 0 && n >= f.limit {
		f.on.Store(false)
	}
	return errorfs.ErrInjected
}

func (f *faults) String() string { return "test faults" }

// selfCommand runs this test binary again with args, for a child that
// must end its own process. Under user-mode emulation (.ci/run's ARM
// tests) the kernel cannot start the binary by itself, so the runner
// names the emulator in IDEM_TEST_EMULATOR.
func selfCommand(ctx context.Context, args ...string) *exec.Cmd {
	if emu := os.Getenv("IDEM_TEST_EMULATOR"); emu != "" {
		return exec.CommandContext(ctx, emu, append([]string{os.Args[0]}, args...)...)
	}
	return exec.CommandContext(ctx, os.Args[0], args...)
}

func isTable(op errorfs.Op) bool { return strings.HasSuffix(op.Path, ".sst") }
func isBlob(op errorfs.Op) bool  { return strings.HasSuffix(op.Path, ".blob") }

// smallBody is record i's body when it should stay in the tables.
func smallBody(i int) []byte { return []byte(fmt.Sprint(i)) }

// blobBody is record i's body when it should go to a blob file at flush:
// 2 KiB of random bytes, which the store cannot compress below Pebble's
// value-separation threshold.
func blobBody(i int) []byte {
	body := make([]byte, 2048)
	rng := rand.New(rand.NewPCG(uint64(i), 2))
	for j := range body {
		body[j] = byte(rng.Uint32())
	}
	return body
}

// fill completes n records with the given bodies and lets the clock run
// past as many older ones, then sweeps with compaction so that the
// survivors are in sstables, not only in the memtable.
func fill(t *testing.T, db *pebblestore.Store, clock *idemtest.Clock, n int, body func(int) []byte) {
	t.Helper()
	for i := range n {
		s := scope(fmt.Sprint("old", i))
		require.NoError(t, claim(t, db, s, fp("a")).Complete(ctx, paid))
	}
	clock.Advance(23 * time.Hour)
	for i := range n {
		s := scope(fmt.Sprint(i))
		require.NoError(t, claim(t, db, s, fp("a")).Complete(ctx, idem.Response{Status: 200, Body: body(i)}))
	}
	clock.Advance(2 * time.Hour)
	res, err := db.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, n, res.Records)
	require.Positive(t, res.Compactions)
}

func checkIntact(t *testing.T, db *pebblestore.Store, n int, body func(int) []byte) {
	t.Helper()
	for i := range n {
		_, rec, err := db.Claim(ctx, scope(fmt.Sprint(i)), fp("a"))
		require.NoError(t, err)
		require.NotNil(t, rec, "key %d must replay", i)
		assert.Equal(t, body(i), rec.Response.Body)
	}
	pebblestore.RequireConsistent(t, db)
}

func TestReadFaultsGiveErrors(t *testing.T) {
	const n = 300
	f := &faults{match: func(op errorfs.Op) bool { return isTable(op) && op.Kind.ReadOrWrite() == errorfs.OpIsRead }}
	fs := errorfs.Wrap(vfs.NewMem(), f)
	clock := idemtest.NewClock()
	opts := pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, CompactBytes: 1, Logger: discard()}, fs)
	db, err := pebblestore.Open("db", opts)
	require.NoError(t, err)
	defer db.Close()
	// The records are in the tables the sweep's compaction just wrote,
	// which nothing has read yet, so lookups must read them. A reopened
	// handle would not do: its first key-filter build scans the records,
	// and races the faults to fill the cache.
	fill(t, db, clock, n, smallBody)
	f.on.Store(true)
	var failed int
	for i := range n {
		_, _, err := db.Claim(ctx, scope(fmt.Sprint(i)), fp("a"))
		if err != nil {
			failed++
		}
		_, err = db.Get(ctx, scope(fmt.Sprint(i)))
		if err != nil {
			assert.NotErrorIs(t, err, idem.ErrNotFound, "a read error must not look like a missing record")
		}
	}
	f.on.Store(false)
	assert.Positive(t, failed, "read faults must surface as errors")
	assert.Positive(t, f.injected.Load())
	t.Logf("%d read faults injected, %d claims failed", f.injected.Load(), failed)
	checkIntact(t, db, n, smallBody)
}

// TestTableWriteFaultsLoseNothing fails for a while the writes of flushes
// and compactions to their tables, or the creation of the blob files that
// completed records' values go to. Pebble retries them in the background;
// the WAL keeps every acknowledged write, and once the fault clears, the
// sweep's compaction goes through and everything is intact. (A blob
// file's failed write, sync or close ends the process instead: see
// TestBlobFileFailureEndsProcess.)
func TestTableWriteFaultsLoseNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match func(errorfs.Op) bool
		body  func(int) []byte
	}{
		{"tables", func(op errorfs.Op) bool { return isTable(op) && op.Kind.ReadOrWrite() == errorfs.OpIsWrite }, smallBody},
		{"blob creation", func(op errorfs.Op) bool { return isBlob(op) && op.Kind == errorfs.OpCreate }, blobBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 300
			f := &faults{limit: 25, match: tc.match}
			fs := errorfs.Wrap(vfs.NewMem(), f)
			clock := idemtest.NewClock()
			db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1, CompactBytes: 1, Logger: discard()}, fs))
			require.NoError(t, err)
			defer db.Close()
			f.on.Store(true)
			fill(t, db, clock, n, tc.body)
			assert.Equal(t, f.limit, f.injected.Load(), "every planned fault was hit")
			checkIntact(t, db, n, tc.body)
			require.NoError(t, db.Close())
			reopened, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{Now: clock.Now, SweepInterval: -1}, fs))
			require.NoError(t, err)
			defer reopened.Close()
			checkIntact(t, reopened, n, tc.body)
		})
	}
}

// TestBlobFileFailureEndsProcess fails, in a child process, a write or
// sync of the blob file a flush writes (errorfs cannot fail a close;
// walfile_test covers it). Pebble dereferences nil on a failed sync (see
// blobFile); an early write it would survive, so that case checks the
// policy that every failed blob write is fatal. Either way the process
// must end with idem's status and message, and the store it leaves must
// open with every acknowledged record.
func TestBlobFileFailureEndsProcess(t *testing.T) {
	const n = 20
	if env := os.Getenv("IDEM_BLOB_CHILD"); env != "" {
		dir, kind, _ := strings.Cut(env, ",")
		blobChild(dir, kind, n)
		return
	}
	for _, kind := range []string{"write", "sync"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			// A child that retried a flush for ever would fail the test,
			// not hang it.
			tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			cmd := selfCommand(tctx, "-test.run=^TestBlobFileFailureEndsProcess$")
			cmd.Env = append(os.Environ(), "IDEM_BLOB_CHILD="+dir+","+kind)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "output: %s", out)
			assert.Equal(t, 74, exit.ExitCode(), "output: %s", out)
			assert.Regexp(t, `idem: fatal storage error.*: `+kind+` \S+\.blob: `, string(out))

			db, err := pebblestore.Open(filepath.Join(dir, "db"), &pebblestore.Options{SweepInterval: -1})
			require.NoError(t, err)
			defer db.Close()
			checkIntact(t, db, n, blobBody)
		})
	}
}

func blobChild(dir, kind string, n int) {
	kinds := map[string][]errorfs.OpKind{
		"write": {errorfs.OpFileWrite, errorfs.OpFileWriteAt},
		"sync":  {errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo},
	}[kind]
	// A few faults, not endless ones: a store that survived them would
	// finish the flush and say so, rather than retry it for ever.
	f := &faults{limit: 5, match: func(op errorfs.Op) bool { return isBlob(op) && slices.Contains(kinds, op.Kind) }}
	db := childStore(filepath.Join(dir, "db"), f)
	for i := range n {
		l, _, err := db.Claim(ctx, scope(fmt.Sprint(i)), fp("a"))
		if err == nil {
			err = l.Complete(ctx, idem.Response{Status: 200, Body: blobBody(i)})
		}
		if err != nil {
			fmt.Println("child failed before the fault:", err)
			os.Exit(3)
		}
	}
	f.on.Store(true)
	err := db.FlushMemtable()
	fmt.Println("child survived:", err)
	os.Exit(0)
}

// TestWALFailureAtCloseIsReturned fails the log's final sync, which Close
// asks for after every acknowledged write is already synced: Close reports
// it and the process goes on; the store reopens with everything.
func TestWALFailureAtCloseIsReturned(t *testing.T) {
	f := &faults{match: isLogSync}
	fs := errorfs.Wrap(vfs.NewMem(), f)
	db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{SweepInterval: -1, Logger: discard()}, fs))
	require.NoError(t, err)
	require.NoError(t, claim(t, db, scope("before"), fp("a")).Complete(ctx, paid))

	f.on.Store(true)
	err = db.Close()
	f.on.Store(false)
	require.Positive(t, f.injected.Load(), "Close synced the log")
	assert.ErrorIs(t, err, errorfs.ErrInjected)

	db, err = pebblestore.Open("db", pebblefs.With(&pebblestore.Options{SweepInterval: -1}, fs))
	require.NoError(t, err)
	defer db.Close()
	rec, err := db.Get(ctx, scope("before"))
	require.NoError(t, err)
	assert.Equal(t, paid.Body, rec.Response.Body)
}

// TestWALRotationFailureEndsProcess fails, in a child process, one of the
// steps of a log rotation (forced by compacting the store): the old log's
// last sync, the new log's creation, the directory's sync. Pebble panics
// on each, with its mutex released; idem must end the process first, with
// its status and message.
func TestWALRotationFailureEndsProcess(t *testing.T) {
	if env := os.Getenv("IDEM_ROTATE_CHILD"); env != "" {
		dir, kind, _ := strings.Cut(env, ",")
		rotateChild(dir, kind)
		return
	}
	for kind, want := range map[string]string{
		"log-sync": `sync \S+\.log: `,
		"create":   `create \S+\.log: `,
		"dir-sync": `sync \S+db: `,
	} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			cmd := selfCommand(ctx, "-test.run=^TestWALRotationFailureEndsProcess$")
			cmd.Env = append(os.Environ(), "IDEM_ROTATE_CHILD="+dir+","+kind)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "output: %s", out)
			assert.Equal(t, 74, exit.ExitCode(), "output: %s", out)
			assert.Regexp(t, `idem: fatal storage error.*: `+want, string(out))

			db, err := pebblestore.Open(filepath.Join(dir, "db"), &pebblestore.Options{SweepInterval: -1})
			require.NoError(t, err)
			defer db.Close()
			for i := range 20 {
				rec, err := db.Get(ctx, scope(fmt.Sprint(i)))
				require.NoError(t, err)
				assert.Equal(t, paid.Body, rec.Response.Body)
			}
		})
	}
}

func rotateChild(dir, kind string) {
	db := filepath.Join(dir, "db")
	f := &faults{match: func(op errorfs.Op) bool {
		switch kind {
		case "log-sync":
			return isLogSync(op)
		case "create":
			return strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpCreate || op.Kind == errorfs.OpReuseForWrite)
		default:
			return op.Path == db && op.Kind == errorfs.OpFileSync
		}
	}}
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprint(i)
	}
	s := childStore(db, f, keys...)
	f.on.Store(true)
	_, err := s.Compact(ctx, nil)
	fmt.Println("child survived:", err)
	os.Exit(0)
}

// TestWALFailureEndsProcess runs a child process whose WAL sync fails: it
// must exit with the documented status and message, never carry on. The
// store it leaves must open, with what was acknowledged before the fault.
func TestWALFailureEndsProcess(t *testing.T) {
	if dir := os.Getenv("IDEM_WAL_CHILD"); dir != "" {
		walChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := selfCommand(ctx, "-test.run=^TestWALFailureEndsProcess$")
	cmd.Env = append(os.Environ(), "IDEM_WAL_CHILD="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output: %s", out)
	assert.Equal(t, 74, exit.ExitCode())
	assert.Regexp(t, `idem: fatal storage error.*: sync \S+\.log: `, string(out))
	assert.NotContains(t, string(out), "child survived")

	db, err := pebblestore.Open(filepath.Join(dir, "db"), &pebblestore.Options{SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	rec, err := db.Get(ctx, scope("before"))
	require.NoError(t, err)
	assert.Equal(t, paid.Body, rec.Response.Body)
}

func walChild(dir string) {
	f := &faults{match: isLogSync}
	db := childStore(filepath.Join(dir, "db"), f, "before")
	f.on.Store(true)
	_, _, err := db.Claim(ctx, scope("after"), fp("a"))
	fmt.Println("child survived:", err)
	os.Exit(0)
}

func isLogSync(op errorfs.Op) bool {
	return strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo)
}

// childStore opens, in a child process, the store in dir over a disk whose
// faults f injects once switched on, and completes keys with paid first.
// Any failure before the fault exits with status 3, which no test expects.
func childStore(dir string, f *faults, keys ...string) *pebblestore.Store {
	db, err := pebblestore.Open(dir, pebblefs.With(&pebblestore.Options{SweepInterval: -1}, errorfs.Wrap(vfs.Default, f)))
	for _, k := range keys {
		if err != nil {
			break
		}
		var l idem.Lease
		if l, _, err = db.Claim(ctx, scope(k), fp("a")); err == nil {
			err = l.Complete(ctx, paid)
		}
	}
	if err != nil {
		fmt.Println("before the fault:", err)
		os.Exit(3)
	}
	return db
}

// TestBlobReadFaultsAreReadErrors: a completed record's value lives in a
// blob file once flushed, and Pebble reports a failed read of it only when
// the value is released. The store must still answer with that read error,
// not call the record corrupt or absent, and answer normally once the
// fault clears.
func TestBlobReadFaultsAreReadErrors(t *testing.T) {
	f := &faults{match: func(op errorfs.Op) bool { return isBlob(op) && op.Kind.ReadOrWrite() == errorfs.OpIsRead }}
	opts := pebblefs.With(&pebblestore.Options{SweepInterval: -1, Logger: discard()}, errorfs.Wrap(vfs.NewMem(), f))
	db, err := pebblestore.Open("db", opts)
	require.NoError(t, err)
	body := blobBody(1)
	require.NoError(t, claim(t, db, scope("blob"), fp("a")).Complete(ctx, idem.Response{Status: 200, Body: body}))
	require.NoError(t, db.FlushMemtable())
	require.NoError(t, db.Close())

	db, err = pebblestore.Open("db", opts) // a cold cache: the read goes to the file
	require.NoError(t, err)
	defer db.Close()
	f.on.Store(true)
	_, err = db.Get(ctx, scope("blob"))
	require.Error(t, err)
	assert.ErrorIs(t, err, errorfs.ErrInjected)
	assert.NotErrorIs(t, err, idem.ErrCorrupt)
	assert.NotErrorIs(t, err, idem.ErrNotFound)
	_, _, err = db.Claim(ctx, scope("blob"), fp("a"))
	assert.ErrorIs(t, err, errorfs.ErrInjected, "a claim must fail with the read error, not run again")
	f.on.Store(false)
	require.Positive(t, f.injected.Load(), "no blob file was read")

	_, rec, err := db.Claim(ctx, scope("blob"), fp("a"))
	require.NoError(t, err)
	require.NotNil(t, rec)
	assert.Equal(t, body, rec.Response.Body)
}

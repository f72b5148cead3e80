package pebblestore_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/internal/walfs"
	"github.com/idemkv/idem/pebblestore"
)

// outcome is what a worker was told about one key, in the order it was told.
type outcome int

const (
	claimed outcome = iota + 1
	completed
	released
	unknown
)

// crashBody is the response body a worker stores for key i: some bodies are
// inline, some are split into chunks.
func crashBody(i int) []byte {
	size := 100 + (i%7)*40_000
	return bytes.Repeat([]byte{byte(i)}, size)
}

// TestCrashKeepsAcknowledgedWrites runs workers that claim keys and end
// their leases in every way, takes a crash image of the filesystem at a
// random moment, and reopens the image: everything acknowledged before the
// image was taken must be there, and nothing else may be half there.
//
// Every other round runs under the smallest memory budget, whose memtables
// fill within the round, so that the image catches flushes, blob files
// and compactions too.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	for round, unsynced := range []int{0, 10, 50, 90, 100, 30} {
		memory := int64(0)
		if round%2 == 1 {
			memory = 4 << 20
		}
		t.Run(fmt.Sprintf("unsynced=%d,memory=%d", unsynced, memory), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(round), 7))
			fs := vfs.NewCrashableMem()
			opts := pebblefs.With(&pebblestore.Options{SweepInterval: -1, InlineBodyBytes: 64 << 10, MaxBodyBytes: 1 << 20, MemoryBytes: memory}, fs)
			db, err := pebblestore.Open("db", opts)
			require.NoError(t, err)

			// Let some work be acknowledged before the crash; the amount, not
			// the time, is what matters.
			target := 200 + rng.IntN(400)
			reached := make(chan struct{})
			var (
				mu     sync.Mutex
				acked  = map[int]outcome{}
				next   int
				signal sync.Once
			)
			ack := func(i int, o outcome) {
				mu.Lock()
				defer mu.Unlock()
				acked[i] = o
				if len(acked) >= target {
					signal.Do(func() { close(reached) })
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					wrng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
					for {
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						i := next
						next++
						mu.Unlock()
						s := scope(fmt.Sprint(i))
						l, _, err := db.Claim(ctx, s, fp(fmt.Sprint(i)))
						if err != nil {
							return // closed under us
						}
						ack(i, claimed)
						var end outcome
						switch r := wrng.IntN(10); {
						case r < 6:
							end, err = completed, l.Complete(ctx, idem.Response{Status: 201, Body: crashBody(i)})
						case r < 8:
							end, err = released, l.Release(ctx)
						case r < 9:
							end, err = unknown, l.MarkUnknown(ctx)
						default:
							continue // left in progress
						}
						if err != nil {
							return
						}
						ack(i, end)
					}
				}()
			}
			<-reached
			mu.Lock()
			snapshot := make(map[int]outcome, len(acked))
			for k, v := range acked {
				snapshot[k] = v
			}
			mu.Unlock()
			image := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(uint64(round), 99))})
			close(stop)
			wg.Wait()
			require.NoError(t, db.Close())

			after, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{SweepInterval: -1, InlineBodyBytes: 64 << 10, MaxBodyBytes: 1 << 20, MemoryBytes: memory}, image))
			require.NoError(t, err, "the crash image must open")
			defer after.Close()
			pebblestore.RequireConsistent(t, after, "no write may be half applied")
			for i, want := range snapshot {
				s := scope(fmt.Sprint(i))
				rec, err := after.Get(ctx, s)
				switch want {
				case released:
					assert.ErrorIs(t, err, idem.ErrNotFound, "key %d was released", i)
					continue
				case claimed:
					// Its outcome may or may not have reached the disk, but the
					// claim itself did, unless a later release did too.
					if err != nil {
						assert.ErrorIs(t, err, idem.ErrNotFound, "key %d", i)
						continue
					}
				default:
					require.NoError(t, err, "key %d was acknowledged as %d", i, want)
				}
				assert.Equal(t, fp(fmt.Sprint(i)), rec.Fingerprint)
				switch {
				case want == completed:
					assert.Equal(t, idem.StateCompleted, rec.State, "key %d", i)
				case want == unknown:
					assert.Equal(t, idem.StateUnknown, rec.State, "key %d", i)
				}
				if rec.State == idem.StateCompleted {
					assert.Equal(t, crashBody(i), rec.Response.Body, "key %d body", i)
				}
			}
			t.Logf("crash image after %d acknowledged keys", len(snapshot))
		})
	}
}

// The store's own log carries zeros after its last record, on a fresh store
// and after a crash that leaves the log unclosed; Pebble must read past
// neither as data.
func TestStoreReopensOverZeroedLogTail(t *testing.T) {
	dir := t.TempDir()
	db, err := pebblestore.Open(dir, &pebblestore.Options{SweepInterval: -1})
	require.NoError(t, err)
	ctx := context.Background()
	var scopes []idem.Scope
	for i := range 50 {
		s := idem.Scope{Tenant: "t", Endpoint: "POST /x", Key: string(rune('a'+i%26)) + string(rune('a'+i/26))}
		l, _, err := db.Claim(ctx, s, idem.Fingerprint{byte(i)})
		require.NoError(t, err)
		require.NoError(t, l.Complete(ctx, idem.Response{Status: 201, Body: []byte{byte(i)}}))
		scopes = append(scopes, s)
	}
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	require.NoError(t, err)
	var zeroTail bool
	for _, name := range logs {
		info, err := os.Stat(name)
		require.NoError(t, err)
		zeroTail = zeroTail || info.Size() >= walfs.ZeroAhead/2
	}
	require.True(t, zeroTail, "the live log has zeros ahead of its end")

	// A copy taken while the store is open is what a crash leaves: every
	// acknowledged write is synced, and the log was never closed.
	crashed := t.TempDir()
	require.NoError(t, os.CopyFS(crashed, os.DirFS(dir)))
	require.NoError(t, db.Close())

	for _, d := range []string{crashed, dir} {
		db, err := pebblestore.Open(d, &pebblestore.Options{SweepInterval: -1})
		require.NoError(t, err)
		for i, s := range scopes {
			rec, err := db.Get(ctx, s)
			require.NoError(t, err)
			assert.Equal(t, []byte{byte(i)}, rec.Response.Body)
		}
		require.NoError(t, db.Close())
	}
}

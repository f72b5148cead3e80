package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// The store benchmarks run the harness's workloads under testing.B, named
// so that benchstat can pivot on conc, sync and system:
//
//	go test ./bench -run '^$' -bench 'Claim|Complete|Replay' -count 6 > new.txt

func openBench(b *testing.B, name string) system {
	b.Helper()
	s, err := openers[name](env{dir: b.TempDir(), maxConc: 64, bodies: benchBodies})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.close() })
	return s
}

// parallel runs fn from conc goroutines until b.N calls are done.
func parallel(b *testing.B, conc int, fn func(rng *rand.Rand) error) {
	b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0)))
	var seed atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 3))
		for pb.Next() {
			if err := fn(rng); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchBodies are the 1 KiB bodies the benchmarks store, as the harness's.
var benchBodies = newBodies(1024)

func BenchmarkClaimComplete(b *testing.B) {
	claimComplete := func(s system, rng *rand.Rand) error {
		o := newOp(rng.IntN(100))
		return s.claimComplete(context.Background(), o, benchBodies.of(o.key))
	}
	for _, conc := range []int{1, 16, 64} {
		for _, name := range []string{"idem", "pebble", "pebble-tuned"} {
			b.Run(fmt.Sprintf("conc=%d/system=%s", conc, name), func(b *testing.B) {
				s := openBench(b, name)
				s.syncsPerOp() // start counting here
				b.ReportAllocs()
				b.SetBytes(int64(benchBodies.n))
				if conc == 1 {
					rng := rand.New(rand.NewPCG(1, 2))
					for b.Loop() {
						if err := claimComplete(s, rng); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					parallel(b, conc, func(rng *rand.Rand) error { return claimComplete(s, rng) })
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				if spo := s.syncsPerOp(); spo > 0 {
					b.ReportMetric(spo, "fsyncs/op")
				}
			})
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	for _, name := range []string{"idem", "pebble", "pebble-tuned"} {
		b.Run("system="+name, func(b *testing.B) {
			s := openBench(b, name)
			ops := make([]op, 1000)
			for i := range ops {
				ops[i] = newOp(i % 100)
				if err := s.claimComplete(ctx, ops[i], benchBodies.of(ops[i].key)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			rng := rand.New(rand.NewPCG(1, 2))
			for b.Loop() {
				if _, err := s.replay(ctx, ops[rng.IntN(len(ops))]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// openIdemBench opens idem on the disk (sync=true) or on an in-memory
// filesystem whose sync is free (sync=false), so that the two sub-benchmarks
// separate idem's own work from the disk's.
func openIdemBench(b *testing.B, sync bool) *pebblestore.Store {
	b.Helper()
	opts, dir := &pebblestore.Options{SweepInterval: -1}, b.TempDir()
	if !sync {
		opts, dir = pebblefs.With(opts, vfs.NewMem()), "db"
	}
	db, err := pebblestore.Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func scopeOf(o op) idem.Scope { return idem.Scope{Tenant: o.tenant, Endpoint: endpoint, Key: o.key} }

// BenchmarkClaim is the claim alone: a fresh key, durably marked in
// progress. Nothing is completed.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	for _, conc := range []int{1, 64} {
		for _, sync := range []bool{true, false} {
			b.Run(fmt.Sprintf("conc=%d/sync=%t", conc, sync), func(b *testing.B) {
				db := openIdemBench(b, sync)
				claim := func(rng *rand.Rand) error {
					o := newOp(rng.IntN(100))
					_, _, err := db.Claim(ctx, scopeOf(o), o.fp)
					return err
				}
				b.ReportAllocs()
				if conc == 1 {
					rng := rand.New(rand.NewPCG(1, 2))
					for b.Loop() {
						if err := claim(rng); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					parallel(b, conc, claim)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkComplete is the completion alone, with a 1 KiB body, of a claim
// made outside the timer: claims are taken in batches, concurrently, with
// the timer stopped.
func BenchmarkComplete(b *testing.B) {
	ctx := context.Background()
	for _, sync := range []bool{true, false} {
		b.Run(fmt.Sprintf("conc=1/sync=%t", sync), func(b *testing.B) {
			db := openIdemBench(b, sync)
			var leases []idem.Lease
			refill := func() {
				b.StopTimer()
				defer b.StartTimer()
				leases = claimBatch(b, db, 256)
			}
			b.ReportAllocs()
			b.SetBytes(int64(benchBodies.n))
			for b.Loop() {
				if len(leases) == 0 {
					refill()
				}
				l := leases[len(leases)-1]
				leases = leases[:len(leases)-1]
				resp := idem.Response{Status: 201, Header: benchHeader, Body: benchBodies.of(l.Scope().Key)}
				if err := l.Complete(ctx, resp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// claimBatch claims n fresh keys from 16 goroutines, so that the claims
// share syncs and the refill stays short.
func claimBatch(b *testing.B, db *pebblestore.Store, n int) []idem.Lease {
	leases := make([]idem.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				o := newOp(i % 100)
				leases[i], _, errs[i] = db.Claim(context.Background(), scopeOf(o), o.fp)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return leases
}

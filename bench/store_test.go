package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
)

// The store benchmarks run the harness's workloads under testing.B, named
// so that benchstat can pivot on conc and system:
//
//	go test ./bench -run '^$' -bench 'ClaimComplete|Replay' -count 6 > new.txt

func openBench(b *testing.B, name string) system {
	b.Helper()
	s, err := openers[name](b.TempDir())
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

func BenchmarkClaimComplete(b *testing.B) {
	body := make([]byte, 1024)
	ctx := context.Background()
	for _, conc := range []int{1, 16, 64} {
		for _, name := range []string{"idem", "pebble", "pebble-tuned"} {
			b.Run(fmt.Sprintf("conc=%d/system=%s", conc, name), func(b *testing.B) {
				s := openBench(b, name)
				s.syncsPerOp() // start counting here
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				if conc == 1 {
					rng := rand.New(rand.NewPCG(1, 2))
					for b.Loop() {
						if err := s.claimComplete(ctx, newOp(rng.IntN(100)), body); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					parallel(b, conc, func(rng *rand.Rand) error { return s.claimComplete(ctx, newOp(rng.IntN(100)), body) })
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
	body := make([]byte, 1024)
	ctx := context.Background()
	for _, name := range []string{"idem", "pebble", "pebble-tuned"} {
		b.Run("system="+name, func(b *testing.B) {
			s := openBench(b, name)
			ops := make([]op, 1000)
			for i := range ops {
				ops[i] = newOp(i % 100)
				if err := s.claimComplete(ctx, ops[i], body); err != nil {
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

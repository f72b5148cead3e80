package main

import (
	"testing"
)

// BenchmarkMiddleware is idemhttp's cost per request: the no-op handler
// behind the middleware (system=idemhttp) and alone (system=bare), called
// directly with a recorder, a fresh key each time, over a store on an
// in-memory filesystem whose sync is free. The overhead is the difference
// of the two us/op figures.
func BenchmarkMiddleware(b *testing.B) {
	n, err := newNoopBench()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.close() })
	for _, sys := range []struct {
		name string
		h    func() error
	}{
		{"bare", func() error { return n.serve(n.bare) }},
		{"idemhttp", func() error { return n.serve(n.wrapped) }},
	} {
		b.Run("handler=noop/system="+sys.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := sys.h(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N), "us/op")
		})
	}
}

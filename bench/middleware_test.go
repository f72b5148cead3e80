package main

import (
	"testing"
)

// BenchmarkMiddleware is idemhttp's cost per request: the no-op handler
// alone (system=bare) and behind the middleware (system=idemhttp), called
// directly with a recorder, a fresh key each time. store=db is the
// embedded store on an in-memory filesystem whose sync is free; store=mem
// is idemtest's MemStore, so that the middleware's own cost shows apart
// from the engine's. The overhead is the difference of the us/op figures.
func BenchmarkMiddleware(b *testing.B) {
	db, err := newNoopBench(false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.close() })
	mem, err := newNoopBench(true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mem.close() })
	for _, sys := range []struct {
		name string
		h    func() error
	}{
		{"system=bare", func() error { return db.serve(db.bare) }},
		{"system=idemhttp/store=db", func() error { return db.serve(db.wrapped) }},
		{"system=idemhttp/store=mem", func() error { return mem.serve(mem.wrapped) }},
	} {
		b.Run("handler=noop/"+sys.name, func(b *testing.B) {
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

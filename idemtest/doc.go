// Package idemtest tests code built on idem's contract, without the
// embedded store's engine: it imports the contract, package idem, and
// nothing of Pebble.
//
// # Basics
//
// Most callers want MemStore: an in-memory idem.Operator that answers
// as *pebblestore.Store does. Hand it to whatever takes a idem.Store (the
// idemhttp middleware, a handler of your own) and drive its time with a
// Clock, so that leases run out and records expire when the test says:
//
//	clock := idemtest.NewClock()
//	store, err := idemtest.NewMemStore(&idemtest.MemOptions{Now: clock.Now})
//	defer store.Close()
//	// ... claim, then:
//	clock.Advance(time.Minute) // the default 30-second lease has run out
//
// A backend of the contract calls TestStore from one of its tests, with a
// function that opens an empty store on the suite's clock. The suite runs
// every property of idem.Store, and of idem.Operator when the
// store is one, as a subtest of its own.
//
// # Guarantees
//
// MemStore passes TestStore, and so does *pebblestore.Store, in memory and on disk;
// a test of this package shows that stores which break the contract fail
// it. MemStore keeps what it stores in memory only, for the life of the
// value.
//
// Clock is the fake clock of the whole repository: idem's own tests use
// it too.
package idemtest

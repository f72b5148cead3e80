// Package contract holds the vocabulary of idem's idempotency contract and
// imports no storage engine: the Scope a key lives in, the Fingerprint of
// a canonical request, the Record a store keeps and its State, the errors
// a claim is refused with, the Store and Lease interfaces every backend
// implements, the HTTP header names and problem codes, and the
// canonicalizer behind fingerprints.
//
// Most programs use these names through package idem, which re-exports
// them beside the embedded store (idem.Scope is contract.Scope). Import
// contract directly to stay free of the embedded engine: a client, a
// second backend, a fuzzer of the canonicalizer.
package contract

// Package idem is the contract of idempotency keys that makes retried API
// writes safe: a client names one logical operation with a key and sends
// it on every retry, and the server runs the operation once and answers
// every repeat with the first answer.
//
// The package holds the contract's words and imports no storage engine:
// the Scope a key lives in, the Fingerprint of a canonical request, the
// Record a store keeps and its State, the errors a claim is refused with,
// the Store, Lease and Operator interfaces every backend implements, Do
// (which runs an operation at most once under a claim), the HTTP header
// names and problem codes, and the canonicalizer behind fingerprints.
//
// The backends live beside it: pebblestore embeds the store in your
// process (the default, no server to run), pgstore shares it between
// replicas on PostgreSQL, and idemtest's MemStore keeps it in memory for
// tests, with the conformance suite all three pass. idemhttp applies the
// contract to net/http handlers, idemgrpc to gRPC, idemclient is the
// client's half, and the idem command runs it in front of any HTTP
// service.
package idem

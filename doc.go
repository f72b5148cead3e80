// Package idem stores idempotency keys in an embedded Pebble database so that
// a retried API write runs once.
package idem

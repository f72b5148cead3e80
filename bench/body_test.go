package main

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBodies(t *testing.T) {
	b := newBodies(1024)
	require.Len(t, b.v, 1024)
	seen := map[string]bool{}
	for _, v := range b.v {
		assert.Len(t, v, 1024)
		assert.True(t, json.Valid(v), "%s", v)
		seen[string(v)] = true
	}
	assert.Len(t, seen, len(b.v), "variants repeat")
	assert.Equal(t, responseBody(1024, 7), b.v[7], "a variant is not reproducible")

	key := uuid.NewString()
	assert.Equal(t, b.of(key), b.of(key), "one key picks two bodies: replays would not match")
	picked := map[string]bool{}
	for range 200 {
		picked[string(b.of(uuid.NewString()))] = true
	}
	assert.Greater(t, len(picked), 150, "keys pick few variants")

	for n, want := range map[int]int{0: 1024, 1024: 1024, 64 << 10: 512, 8 << 20: 4, 100 << 20: 1} {
		assert.Equal(t, want, variantCount(n), "variants of %d bytes", n)
	}
}

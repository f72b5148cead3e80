package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "512B": 512, "4KiB": 4 << 10, "4kib": 4 << 10, "4K": 4 << 10, "4k": 4 << 10,
		"4MiB": 4 << 20, "4M": 4 << 20, "1GiB": 1 << 30, "1g": 1 << 30, "4KB": 4000, "4kB": 4000, "4MB": 4e6,
		"1GB": 1e9, " 8 MiB ": 8 << 20,
	} {
		var s byteSize
		require.NoError(t, s.Set(in), in)
		assert.Equal(t, want, int64(s), in)
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "4TiB", "4 M B", "0x10", "9999999999GiB"} {
		var s byteSize
		assert.Error(t, s.Set(in), in)
	}
	for in, want := range map[int64]string{4 << 20: "4MiB", 1 << 30: "1GiB", 1536: "1536", 3 << 10: "3KiB", 0: "0", 1000: "1000"} {
		s := byteSize(in)
		assert.Equal(t, want, s.String())
	}
}

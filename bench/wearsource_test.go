package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInfoField(t *testing.T) {
	info := "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_current_size:123456\r\naof_base_size:100\r\n"
	n, err := infoField(info, "aof_current_size")
	require.NoError(t, err)
	assert.Equal(t, uint64(123456), n)
	_, err = infoField(info, "aof_rewrite_buffer_length")
	assert.Error(t, err)
	_, err = infoField("aof_current_size:x\r\n", "aof_current_size")
	assert.Error(t, err)
}

func TestOnThisMachine(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1":           true,
		"::1":                 true,
		"localhost":           true,
		"/var/run/postgresql": true,
		"10.0.0.5":            false,
		"db.example.com":      false,
	} {
		assert.Equal(t, want, onThisMachine(host), host)
	}
}

func TestUsesPG(t *testing.T) {
	for name, want := range map[string]bool{"postgres": true, "pgstore": true, "proxy-pg-2": true, "idem-proxy": false, "redis": false} {
		assert.Equal(t, want, usesPG(name), name)
	}
}

// TestOwnBytesOfTheEmbeddedStore checks that the systems on the embedded
// store in this process fill the own column: their count grows with a
// claim+complete.
func TestOwnBytesOfTheEmbeddedStore(t *testing.T) {
	ctx := context.Background()
	e := env{maxConc: 2, bodies: newBodies(64)}
	for _, name := range []string{"idem", "idem-http"} {
		t.Run("system="+name, func(t *testing.T) {
			e.dir = filepath.Join(t.TempDir(), name)
			s, err := openers[name](e)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, s.close()) })
			o, ok := s.(ownWriter)
			require.True(t, ok, "%s counts no bytes of its own", name)
			before, err := o.bytesWritten(ctx)
			require.NoError(t, err)
			op := newOp(7)
			require.NoError(t, s.claimComplete(ctx, op, e.bodies.of(op.key)))
			after, err := o.bytesWritten(ctx)
			require.NoError(t, err)
			assert.Greater(t, after, before)
		})
	}
}

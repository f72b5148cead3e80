package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProxyRows runs one operation of each workload through the idem-proxy,
// upstream and proxy-hop systems: the proxy stores the upstream's answer,
// counts the bytes that cost its store, and gives the answer back on the
// retry; the upstream and the hop answer without storing.
func TestProxyRows(t *testing.T) {
	ctx := context.Background()
	e := env{maxConc: 2, bodies: newBodies(64)}
	root := t.TempDir() // the proxy binary, built once, lives beside the systems' directories
	for _, name := range []string{"idem-proxy", "upstream", "proxy-hop"} {
		t.Run("system="+name, func(t *testing.T) {
			e.dir = filepath.Join(root, name)
			s, err := openers[name](e)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, s.close()) })
			own, counts := s.(ownWriter)
			var before uint64
			if name == "idem-proxy" {
				require.True(t, counts, "the proxy's store counts what it writes")
				before, err = own.bytesWritten(ctx)
				require.NoError(t, err)
			}
			o := newOp(7)
			require.NoError(t, s.claimComplete(ctx, o, e.bodies.of(o.key)))
			if name == "idem-proxy" {
				after, err := own.bytesWritten(ctx)
				require.NoError(t, err)
				assert.Greater(t, after, before, "a claim+complete writes to the proxy's store")
			}
			body, err := s.replay(ctx, o)
			if _, ok := s.(noReplay); ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, e.bodies.of(o.key), body)
		})
	}
}

package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProxyRows runs one operation of each workload through the idem-proxy
// and upstream systems: the proxy stores the upstream's answer and gives
// it back on the retry, and the upstream answers without it.
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
			o := newOp(7)
			require.NoError(t, s.claimComplete(ctx, o, e.bodies.of(o.key)))
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

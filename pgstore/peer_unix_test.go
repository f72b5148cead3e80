//go:build unix

package pgstore

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPeerClosedBesideAPendingRead: pgx's background reader may still be
// blocked in a read on an idle connection; the check must answer at once
// beside it, and see the peer's close.
func TestPeerClosedBesideAPendingRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	server := <-accepted

	read := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := c.Read(b[:])
		read <- err
	}()
	// The read is pending soon after it starts; checking many times
	// reaches it without waiting for it.
	answered := make(chan bool, 1)
	go func() {
		closed := false
		for range 100000 {
			closed = closed || peerClosed(c)
		}
		answered <- closed
	}()
	select {
	case closed := <-answered:
		assert.False(t, closed, "an open, quiet connection")
	case <-time.After(10 * time.Second):
		t.Fatal("peerClosed waits for the pending read")
	}

	require.NoError(t, server.Close())
	require.Error(t, <-read)
	assert.True(t, peerClosed(c), "a connection the peer closed")
}

//go:build unix

package pgstore

import (
	"net"
	"syscall"
)

// peerClosed reports whether c, an idle connection, has anything to read
// now: an end of file, an error, or a message the server sent on its own,
// which on an idle connection is its last words before closing it. It
// never waits: not for data, and not for a read that pgx's background
// reader may still have pending on the socket, which holds the read lock
// until data comes; so it peeks under Control, which takes no lock.
func peerClosed(c net.Conn) bool {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = t.NetConn() // TLS: look at the socket under it
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	if raw.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
	}) != nil {
		return false
	}
	return closed
}

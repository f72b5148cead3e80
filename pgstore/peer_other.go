//go:build !unix

package pgstore

import "net"

// peerClosed cannot look at the socket here; pgxpool's ping of
// connections idle a second or more is the only check.
func peerClosed(net.Conn) bool { return false }

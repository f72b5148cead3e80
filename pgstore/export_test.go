package pgstore

// ListenerPID returns the backend process id of s's listening connection,
// or 0 while it is disconnected, so tests can terminate it.
func ListenerPID(s *Store) uint32 { return s.listener.listenerPID() }

// LockSweep is the advisory lock a sweeping replica holds.
const LockSweep = lockSweep

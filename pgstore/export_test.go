package pgstore

// ListenerPID returns the backend process id of s's listening connection,
// or 0 while it is disconnected, so tests can terminate it.
func ListenerPID(s *Store) uint32 { return s.listener.listenerPID() }

// LockSweep is the advisory lock a sweeping replica holds.
const LockSweep = lockSweep

// SetInsertFirst sets the order of s's next claim on the pool: insert
// first, or read first. Later claims move it as they find records.
func SetInsertFirst(s *Store, first bool) {
	if first {
		s.met.Store(-metBound)
	} else {
		s.met.Store(metBound)
	}
}

// InsertFirst reports the order of s's next claim on the pool.
func InsertFirst(s *Store) bool { return s.insertFirst() }

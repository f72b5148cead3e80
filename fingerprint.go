package idem

import "encoding/hex"

// Fingerprint is the SHA-256 digest of a canonical request. Two requests with
// the same idempotency key must carry the same fingerprint, or the second is
// refused with ErrFingerprintMismatch.
type Fingerprint [32]byte

// String returns the fingerprint in lower-case hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

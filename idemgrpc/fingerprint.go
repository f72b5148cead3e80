package idemgrpc

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/idemkv/idem"
)

// fingerprintVersion starts every hashed encoding, so that a change to
// what is hashed can never collide with fingerprints stored before it.
const fingerprintVersion = "idem-grpc-fingerprint-v1\n"

// Fingerprint returns the SHA-256 of the versioned encoding of a call: the
// version tag, then the full method name and the request's deterministic
// protobuf encoding, each preceded by its length as a big-endian uint64.
// The package documentation says what the encoding treats as one request.
func Fingerprint(fullMethod string, req proto.Message) (idem.Fingerprint, error) {
	body, err := marshal.Marshal(req)
	if err != nil {
		return idem.Fingerprint{}, fmt.Errorf("idemgrpc: the request of %s cannot be encoded: %w", fullMethod, err)
	}
	enc := make([]byte, 0, len(fingerprintVersion)+16+len(fullMethod)+len(body))
	enc = append(enc, fingerprintVersion...)
	enc = binary.BigEndian.AppendUint64(enc, uint64(len(fullMethod)))
	enc = append(enc, fullMethod...)
	enc = binary.BigEndian.AppendUint64(enc, uint64(len(body)))
	enc = append(enc, body...)
	return sha256.Sum256(enc), nil
}

package idemgrpc_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemgrpc"
)

func fingerprint(t *testing.T, method string, req proto.Message) idem.Fingerprint {
	t.Helper()
	fp, err := idemgrpc.Fingerprint(method, req)
	require.NoError(t, err)
	return fp
}

// Maps are encoded in key order, so a Struct built in any order is one
// request; the method and every value take part.
func TestFingerprint(t *testing.T) {
	base := fingerprint(t, payMethod, payment(t, 42))
	for range 20 {
		assert.Equal(t, base, fingerprint(t, payMethod, payment(t, 42)))
	}
	assert.NotEqual(t, base, fingerprint(t, payMethod, payment(t, 43)))
	assert.NotEqual(t, base, fingerprint(t, refundMethod, payment(t, 42)))
	empty := fingerprint(t, payMethod, &structpb.Struct{})
	assert.NotEqual(t, base, empty)
	assert.Equal(t, empty, fingerprint(t, payMethod, &structpb.Struct{Fields: map[string]*structpb.Value{}}))
}

// The encoding is part of the stored data: a fingerprint written today
// must match the same call next year. This rebuilds the documented layout
// independently and pins one value.
func TestFingerprintEncoding(t *testing.T) {
	req := wrapperspb.String("pay")
	var enc []byte
	enc = append(enc, "idem-grpc-fingerprint-v1\n"...)
	for _, f := range []string{payMethod, "\x0a\x03pay"} {
		enc = binary.BigEndian.AppendUint64(enc, uint64(len(f)))
		enc = append(enc, f...)
	}
	fp := fingerprint(t, payMethod, req)
	assert.Equal(t, idem.Fingerprint(sha256.Sum256(enc)), fp)
	assert.Equal(t, "5960bb01dc103da063111b686bd7c08a99a8a53a331de000e7f5fdde195cec35", fp.String())
}

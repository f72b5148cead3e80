package idem

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrKeyMissing: a sealed value names an encryption key the keyring does
// not hold. The error names the key's id, which is not secret.
var ErrKeyMissing = errors.New("idem: the encryption key a stored value needs is not in the key file")

// ErrKeyFile: a key file cannot be used. The error names the line, never
// what is on it.
var ErrKeyFile = errors.New("idem: bad encryption key file")

// sealVersion is the first byte of every sealed value: the layout below.
const sealVersion = 1

// Keyring holds the AES-256-GCM keys stored values are sealed with: the
// newest seals, every one opens what it sealed, so a key file can list an
// old key until the records under it are sealed again. A Keyring is safe
// for concurrent use.
type Keyring struct {
	aeads  map[string]cipher.AEAD
	ids    []string // in the file's order, newest last
	newest string
}

// A key file holds one key a line, newest last: an id of 1-32 letters,
// digits, '-' or '_', a space, and 32 bytes in standard base64. Blank
// lines and lines starting with '#' are skipped.
const maxKeyIDLen = 32

// ParseKeyring reads a key file's contents.
func ParseKeyring(data []byte) (*Keyring, error) {
	k := &Keyring{aeads: map[string]cipher.AEAD{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, enc, ok := strings.Cut(line, " ")
		if !ok || !validKeyID(id) {
			return nil, fmt.Errorf("%w: line %d: want an id (1-%d of A-Z a-z 0-9 - _), a space and the key in base64", ErrKeyFile, n, maxKeyIDLen)
		}
		if _, dup := k.aeads[id]; dup {
			return nil, fmt.Errorf("%w: line %d: key id %q is listed twice", ErrKeyFile, n, id)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("%w: line %d: key %q is not 32 bytes in standard base64", ErrKeyFile, n, id)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrKeyFile, n, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrKeyFile, n, err)
		}
		k.aeads[id] = aead
		k.ids = append(k.ids, id)
		k.newest = id
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	if k.newest == "" {
		return nil, fmt.Errorf("%w: it holds no key", ErrKeyFile)
	}
	return k, nil
}

// ReadKeyring reads the key file at path. A file that others than its
// owner may read is refused: the keys are as secret as the answers.
func ReadKeyring(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s may be read by others than its owner (mode %v): chmod 600 it", ErrKeyFile, path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	return ParseKeyring(data)
}

func validKeyID(id string) bool {
	if id == "" || len(id) > maxKeyIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// NewKeyLine returns one key file line: id and 32 bytes from the
// operating system's cryptographic source.
func NewKeyLine(id string) (string, error) {
	if !validKeyID(id) {
		return "", fmt.Errorf("%w: key id %q: want 1-%d of A-Z a-z 0-9 - _", ErrInvalidOptions, id, maxKeyIDLen)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	return id + " " + base64.StdEncoding.EncodeToString(raw[:]), nil
}

// Newest is the id of the key new values are sealed with.
func (k *Keyring) Newest() string { return k.newest }

// IDs are the keys' ids, newest last.
func (k *Keyring) IDs() []string { return append([]string(nil), k.ids...) }

// Seal encrypts plaintext under the newest key, bound to aad: a sealed
// value opens only with the same aad, so one copied to another record,
// tenant or field does not open. Layout: version, id length, id, nonce,
// ciphertext with its tag.
func (k *Keyring) Seal(plaintext, aad []byte) []byte {
	aead := k.aeads[k.newest]
	out := make([]byte, 0, 2+len(k.newest)+aead.NonceSize()+len(plaintext)+aead.Overhead())
	out = append(out, sealVersion, byte(len(k.newest)))
	out = append(out, k.newest...)
	nonce := out[len(out) : len(out)+aead.NonceSize()]
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on the systems Go supports
	}
	out = out[:len(out)+aead.NonceSize()]
	return aead.Seal(out, nonce, plaintext, aad)
}

// Open decrypts a value Seal made with the same aad. A value under a key
// the ring lacks fails with ErrKeyMissing naming the id; a truncated,
// altered or misplaced one with ErrCorrupt.
func (k *Keyring) Open(sealed, aad []byte) ([]byte, error) {
	id, rest, err := SealedKeyID(sealed)
	if err != nil {
		return nil, err
	}
	aead, ok := k.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w: key id %q", ErrKeyMissing, id)
	}
	if len(rest) < aead.NonceSize()+aead.Overhead() {
		return nil, fmt.Errorf("%w: a sealed value is truncated", ErrCorrupt)
	}
	plain, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], aad)
	if err != nil {
		return nil, fmt.Errorf("%w: a sealed value does not open: altered, truncated or moved from another record", ErrCorrupt)
	}
	return plain, nil
}

// SealedKeyID returns the id of the key sealed was sealed under, and what
// follows it.
func SealedKeyID(sealed []byte) (id string, rest []byte, err error) {
	if len(sealed) < 2 || sealed[0] != sealVersion || len(sealed) < 2+int(sealed[1]) || sealed[1] == 0 {
		return "", nil, fmt.Errorf("%w: not a sealed value", ErrCorrupt)
	}
	n := 2 + int(sealed[1])
	return string(sealed[2:n]), sealed[n:], nil
}

// SealContext is the additional data that binds a sealed value to one
// field (role: "body", "header", ...) of the record at s. Each part comes
// after its length, so no two scopes or roles share a context.
func SealContext(s Scope, role string) []byte {
	var b []byte
	for _, part := range []string{role, s.Tenant, s.Endpoint, s.Key} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b
}

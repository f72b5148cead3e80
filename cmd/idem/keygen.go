package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/idemkv/idem"
	"github.com/oklog/ulid/v2"
)

// keyFormats make one idempotency key each, from the operating system's
// cryptographic source: a key must be unguessable, and a seeded generator
// would repeat itself across restarts.
var keyFormats = map[string]func() (string, error){
	// 122 random bits: the safe default.
	"uuid4": func() (string, error) {
		u, err := uuid.NewRandom()
		return u.String(), err
	},
	// A millisecond timestamp then random bits: keys sort by creation,
	// which keeps B-tree inserts local, at the price of showing when.
	"uuid7": func() (string, error) {
		u, err := uuid.NewV7()
		return u.String(), err
	},
	// The same idea in 26 Crockford base32 characters, 80 of them random.
	"ulid": func() (string, error) {
		u, err := ulid.New(ulid.Timestamp(time.Now()), rand.Reader)
		return u.String(), err
	},
	// 128 random bits in 22 base64url characters: the shortest header.
	"token": func() (string, error) {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		return base64.RawURLEncoding.EncodeToString(b[:]), nil
	},
}

// maxKeygen bounds -n: a million keys is already more than any test needs.
const maxKeygen = 1_000_000

func runKeygen(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	format := fs.String("format", "uuid4", "uuid4, uuid7, ulid or token")
	n := fs.Int("n", 1, "how many keys to print, one a line")
	encryption := fs.Bool("encryption", false, "print one line of an encryption key file instead: an id, a space and a 256-bit AES key in base64")
	id := fs.String("id", "", "with --encryption, the key's `ID`, 1-32 of A-Z a-z 0-9 - _ (default: today's date, UTC)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem keygen [--format uuid4|uuid7|ulid|token] [-n N]
       idem keygen --encryption [--id ID] >> FILE

Prints new idempotency keys from the operating system's cryptographic
random source, one a line. Every format fits idemhttp's default alphabet.

  uuid4  36 characters, 122 random bits; the default
  uuid7  36 characters, time-ordered; shows when it was made
  ulid   26 characters, time-ordered, 80 random bits; shows when
  token  22 base64url characters, 128 random bits; the shortest

A client makes one key per operation, stores it with the operation before
the first attempt, and sends the same key on every retry.

With --encryption it prints one line of a key file instead, from the same
source: append it to the file (mode 0600), newest last. New values are
sealed with the newest key; older lines stay until nothing needs them.

Reference: `+docsURL("docs/client.md")+`

`)
		fs.PrintDefaults()
	}
	if code, done := parseTool(fs, args, stderr); done {
		return code
	}
	if *encryption {
		if *id == "" {
			*id = time.Now().UTC().Format("2006-01-02")
		}
		line, err := idem.NewKeyLine(*id)
		if err != nil {
			return usageError(fs, stderr, "--id %q: want 1-32 of A-Z a-z 0-9 - _", *id)
		}
		fmt.Fprintln(stdout, line)
		return 0
	}
	gen, ok := keyFormats[*format]
	if !ok {
		return usageError(fs, stderr, "--format %q: want uuid4, uuid7, ulid or token", *format)
	}
	if *n < 1 || *n > maxKeygen {
		return usageError(fs, stderr, "-n %d must be between 1 and %d", *n, maxKeygen)
	}
	w := bufio.NewWriter(stdout)
	for range *n {
		k, err := gen()
		if err != nil {
			fmt.Fprintf(stderr, "idem keygen: %v\n", err)
			return 1
		}
		fmt.Fprintln(w, k)
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintf(stderr, "idem keygen: %v\n", err)
		return 1
	}
	return 0
}

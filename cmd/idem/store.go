package main

import (
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkv/idem/pgstore"
)

// The DSN of a PostgreSQL store may hold a password, so no message
// repeats it: they say "the PostgreSQL store", with its host and port at
// most.

// pgWhere names the PostgreSQL store dsn points at by its host and port,
// never by anything that may be secret.
func pgWhere(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil || cfg.Host == "" {
		return "the PostgreSQL store"
	}
	host := cfg.Host
	if !strings.HasPrefix(host, "/") { // a Unix socket's directory has no port to add
		host = net.JoinHostPort(host, strconv.Itoa(int(cfg.Port)))
	}
	return "the PostgreSQL store at " + host
}

// schemaDetail is what an ErrSchemaBehind says beyond its sentinel: the
// version this build needs and the versions missing, without the hint
// meant for programs that call pgstore.Open.
func schemaDetail(err error) string {
	msg := strings.TrimPrefix(err.Error(), pgstore.ErrSchemaBehind.Error()+": ")
	msg, _, _ = strings.Cut(msg, " (open with")
	return msg
}

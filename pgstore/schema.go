package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrAmbiguousSchema: Options.Schema is empty and more than one schema on
// the connection's search_path holds a table of the store's. Open refuses
// rather than pick one, since whichever came first on the path would
// hide the records of the other. The error names the schemas.
var ErrAmbiguousSchema = errors.New("pgstore: more than one schema on the search_path holds idem's tables")

// ErrNoSchema: the schema Options.Schema names does not exist, or it is
// empty and no schema on the connection's search_path exists.
var ErrNoSchema = errors.New("pgstore: no schema to keep idem's tables in")

// Table names, unqualified.
const (
	keysTable       = "idempotency_keys"
	migrationsTable = "idem_schema_migrations"
)

// schema is the schema that holds the store's tables, and every
// statement the store runs, with its tables qualified by that schema.
// Qualified names leave nothing to search_path: a role's or database's
// setting, a pooler's session, the caller's own SET in a transaction
// handed to ClaimTx, or a temporary table of the same name cannot send a
// statement to another table.
type schema struct {
	keys, migrations string // qualified, quoted names

	get, insert, tryInsert, settle, release, extend, wait string
	list, overdue, takeOver, reconcilePick, countOverdue  string
	sweep, countExpired, metrics                          string
}

// findSchema resolves the schema of the store's tables: want when it is
// set, else the one schema on the search_path that holds either table,
// else where an unqualified CREATE TABLE would go (current_schema()), as
// releases that did not qualify names created them.
func findSchema(ctx context.Context, q querier, want string) (*schema, error) {
	if want != "" {
		var ok bool
		if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)", want).Scan(&ok); err != nil {
			return nil, fmt.Errorf("pgstore: find schema: %w", err)
		}
		if !ok {
			return nil, fmt.Errorf("%w: schema %q does not exist", ErrNoSchema, want)
		}
		return newSchema(want), nil
	}
	rows, err := q.Query(ctx, `SELECT n.nspname FROM pg_catalog.pg_namespace n
WHERE n.nspname = ANY (pg_catalog.current_schemas(false)) AND EXISTS (
	SELECT FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relname IN ($1, $2))
ORDER BY n.nspname`, keysTable, migrationsTable)
	if err != nil {
		return nil, fmt.Errorf("pgstore: find schema: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgstore: find schema: %w", err)
	}
	switch len(found) {
	case 1:
		return newSchema(found[0]), nil
	case 0:
	default:
		return nil, fmt.Errorf("%w: %s; name one in Options.Schema, or leave one on the search_path", ErrAmbiguousSchema, strings.Join(found, ", "))
	}
	var current *string
	if err := q.QueryRow(ctx, "SELECT pg_catalog.current_schema()").Scan(&current); err != nil {
		return nil, fmt.Errorf("pgstore: find schema: %w", err)
	}
	if current == nil {
		return nil, fmt.Errorf("%w: no schema on the search_path exists; set Options.Schema or the search_path", ErrNoSchema)
	}
	return newSchema(*current), nil
}

// newSchema fills the statements' {keys} and {migrations} with the
// tables of schema name.
func newSchema(name string) *schema {
	s := &schema{keys: pgx.Identifier{name, keysTable}.Sanitize(),
		migrations: pgx.Identifier{name, migrationsTable}.Sanitize()}
	for dst, src := range map[*string]string{
		&s.get: getSQL, &s.insert: insertSQL, &s.tryInsert: tryInsertSQL,
		&s.settle: settleSQL, &s.release: releaseSQL, &s.extend: extendSQL, &s.wait: waitSQL,
		&s.list: listSQL, &s.overdue: overdueSQL, &s.takeOver: takeOverSQL,
		&s.reconcilePick: reconcilePickSQL, &s.countOverdue: countOverdueSQL,
		&s.sweep: sweepSQL, &s.countExpired: countExpiredSQL, &s.metrics: metricsSQL,
	} {
		*dst = s.fill(src)
	}
	return s
}

// fill qualifies the tables in sql.
func (s *schema) fill(sql string) string {
	return strings.NewReplacer("{keys}", s.keys, "{migrations}", s.migrations).Replace(sql)
}

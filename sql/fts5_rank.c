/*
** aokun_bm25(tbl, 'tbl' [, weight, ...]): the score FTS5's own bm25(tbl [, weight, ...]) gives
** (ext/fts5/fts5_aux.c: k1 = 1.2, b = 0.75, the same column weights, the same IDF floor, the same
** order of floating-point operations), with each row's size in tokens read from a copy of the
** table's %_docsize held in memory instead of one docsize lookup per matching row.
**
** The copy is per connection and table, and holds only while the table's averages record (rows
** and tokens in all) and structure record (its segments: every committed write changes it) are
** those it was taken at. While they differ, each row's size comes from FTS5 (xColumnSize), as
** bm25() reads it, and those lookups are counted: once they add up to a quarter of the table's
** rows the copy is taken again (so between writes a copy costs at most what it saves, and a file
** written between every two searches never pays for one). Inside an explicit transaction, where
** writes not yet committed may be pending, and for a row the copy does not hold, the size comes
** from FTS5 too.
**
** aokun_bm25(tbl, 'tbl', phrases): the score of a query whose phrases are not all in the MATCH
** expression (exact top-k pruning, issue 37: aokun.maxscore_split). `phrases` has one line per
** phrase of that query, in its order: "i term", i the phrase's index in the MATCH expression
** (phrases not listed, such as a repeated filter, are not scored). The sum is bm25()'s of the
** whole query in its own order. Its IDFs (rows holding each term) are kept per term with the
** sizes, while they are current: a common term's rows are not counted again for every search.
**
** Aokun builds this file with the machine's C compiler on first use (aokun.py rank_extension)
** and loads it through APSW; without a compiler it ranks with bm25() itself.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1

/* Fts5ExtensionApi and fts5_api: sqlite3.h declares them (SQLite 3.20 and later). */

/* Rows holding one term (its phrase's nHit), while the sizes they were counted with hold. */
typedef struct Hits Hits;
struct Hits { Hits *next; char *term; sqlite3_int64 n; };

/* One table's sizes: size[rowid] in tokens (all columns), -1 where no row; key = the averages
** and structure records they were read at; hits: terms counted at that key. */
typedef struct Sizes Sizes;
struct Sizes {
  Hits *hits;
  int nHits;
  Sizes *next;
  char *table;
  unsigned char *key;
  int nKey;
  int *size;
  sqlite3_int64 n;
  sqlite3_int64 debt; /* rows sized by FTS5 since the copy went stale */
};

/* The function's user data: the sizes of each table of this connection. */
typedef struct Cache { sqlite3 *db; Sizes *tables; } Cache;

/* What one query computes once: as fts5_aux.c's Fts5Bm25Data, plus the sizes it may use. */
typedef struct Bm25Data {
  int nPhrase;
  int nOrder; /* phrases scored, in order: aOrder[j] is a phrase index (all when no list) */
  int *aOrder;
  double avgdl;
  double *aIDF;
  double *aFreq;
  Sizes *sizes; /* the copy to read sizes from, or NULL */
  Sizes *stale; /* else the stale copy whose debt this query's rows add to, or NULL */
} Bm25Data;

static void hits_free(Sizes *s) {
  s->nHits = 0;
  while (s->hits) {
    Hits *h = s->hits;
    s->hits = h->next;
    sqlite3_free(h->term);
    sqlite3_free(h);
  }
}

static void cache_free(void *p) {
  Cache *c = (Cache *)p;
  while (c && c->tables) {
    Sizes *s = c->tables;
    c->tables = s->next;
    hits_free(s);
    sqlite3_free(s->table);
    sqlite3_free(s->key);
    sqlite3_free(s->size);
    sqlite3_free(s);
  }
  sqlite3_free(c);
}

/* The table's averages and structure records, concatenated (NULL when they cannot be read). */
static unsigned char *records(sqlite3 *db, const char *table, int *pn) {
  sqlite3_stmt *st = 0;
  unsigned char *out = 0;
  int n = 0;
  char *sql = sqlite3_mprintf("select block from \"%w_data\" where id in (1, 10) order by id",
                              table);
  if (sql && sqlite3_prepare_v2(db, sql, -1, &st, 0) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      int m = sqlite3_column_bytes(st, 0);
      unsigned char *grown = sqlite3_realloc(out, n + m + 4);
      if (!grown) { sqlite3_free(out); out = 0; break; }
      out = grown;
      memcpy(out + n, &m, 4);
      if (m) memcpy(out + n + 4, sqlite3_column_blob(st, 0), m);
      n += m + 4;
    }
  }
  sqlite3_finalize(st);
  sqlite3_free(sql);
  *pn = n;
  return out;
}

/* A varint as FTS5 writes them in %_docsize (SQLite's varint format); returns bytes read. */
static int get_varint(const unsigned char *p, const unsigned char *end, sqlite3_int64 *v) {
  sqlite3_uint64 x = 0;
  int i;
  for (i = 0; i < 8 && p + i < end; i++) {
    x = (x << 7) | (p[i] & 0x7f);
    if (!(p[i] & 0x80)) { *v = (sqlite3_int64)x; return i + 1; }
  }
  if (i == 8 && p + 8 < end) { *v = (sqlite3_int64)((x << 8) | p[8]); return 9; }
  *v = -1;
  return 0;
}

/* Read every row's size of `s->table` into s->size. */
static int load_sizes(sqlite3 *db, Sizes *s) {
  sqlite3_stmt *st = 0;
  sqlite3_int64 top = 0;
  int rc;
  char *sql = sqlite3_mprintf("select coalesce(max(id), 0) from \"%w_docsize\"", s->table);
  rc = sql ? sqlite3_prepare_v2(db, sql, -1, &st, 0) : SQLITE_NOMEM;
  sqlite3_free(sql);
  if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) top = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  if (rc != SQLITE_OK || top < 0 || top > 0x3fffffff) return SQLITE_ERROR;
  sqlite3_free(s->size);
  s->n = top + 1;
  s->size = sqlite3_malloc64(sizeof(int) * (sqlite3_uint64)s->n);
  if (!s->size) { s->n = 0; return SQLITE_NOMEM; }
  memset(s->size, 0xff, sizeof(int) * (size_t)s->n);
  sql = sqlite3_mprintf("select id, sz from \"%w_docsize\"", s->table);
  rc = sql ? sqlite3_prepare_v2(db, sql, -1, &st, 0) : SQLITE_NOMEM;
  sqlite3_free(sql);
  while (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    sqlite3_int64 id = sqlite3_column_int64(st, 0), total = 0, v;
    const unsigned char *p = sqlite3_column_blob(st, 1);
    const unsigned char *end = p + sqlite3_column_bytes(st, 1);
    int used;
    while (p && p < end && (used = get_varint(p, end, &v)) > 0) { total += v; p += used; }
    if (id >= 0 && id < s->n && p == end && total <= 0x7fffffff) s->size[id] = (int)total;
  }
  sqlite3_finalize(st);
  return rc;
}

/* The sizes of `table`, current for this connection, or NULL (then FTS5 gives each row's size,
** and *stale is the copy to charge those lookups to). */
static Sizes *sizes_of(Cache *c, const char *table, sqlite3_int64 nRow, Sizes **stale) {
  Sizes *s;
  unsigned char *key;
  int nKey;
  *stale = 0;
  if (!c || !table || !sqlite3_get_autocommit(c->db)) return 0;
  key = records(c->db, table, &nKey);
  if (!key) return 0;
  for (s = c->tables; s && strcmp(s->table, table); s = s->next) {}
  if (s && s->nKey == nKey && !memcmp(s->key, key, nKey)) { sqlite3_free(key); return s; }
  if (!s) { /* none yet: the first searches pay for it as for a stale one */
    s = sqlite3_malloc(sizeof(Sizes));
    if (!s) { sqlite3_free(key); return 0; }
    memset(s, 0, sizeof(Sizes));
    s->table = sqlite3_mprintf("%s", table);
    s->next = c->tables;
    c->tables = s;
  }
  if (s->debt < nRow / 4) { sqlite3_free(key); *stale = s; return 0; }
  sqlite3_free(s->key);
  s->key = 0;
  s->nKey = 0;
  hits_free(s);
  if (!s->table || load_sizes(c->db, s) != SQLITE_OK) { sqlite3_free(key); return 0; }
  s->key = key;
  s->nKey = nKey;
  s->debt = 0;
  return s;
}

static int count_cb(const Fts5ExtensionApi *api, Fts5Context *fts, void *user) {
  (void)api; (void)fts;
  (*(sqlite3_int64 *)user)++;
  return SQLITE_OK;
}

/* Rows holding phrase i: from the table's current copy when it counted `term` already (term:
** the phrase as the query wrote it, or NULL), else counted by FTS5 and kept there. */
static int phrase_hits(const Fts5ExtensionApi *api, Fts5Context *fts, Sizes *sizes, int i,
                       const char *term, int nTerm, sqlite3_int64 *nHit) {
  Hits *h;
  int rc;
  for (h = sizes && term ? sizes->hits : 0; h; h = h->next) {
    if ((int)strlen(h->term) == nTerm && !memcmp(h->term, term, nTerm)) { *nHit = h->n; return 0; }
  }
  *nHit = 0;
  rc = api->xQueryPhrase(fts, i, (void *)nHit, count_cb);
  if (sizes && sizes->nHits >= 4096) hits_free(sizes);
  if (rc == SQLITE_OK && sizes && term && (h = sqlite3_malloc(sizeof(Hits)))) {
    h->term = sqlite3_mprintf("%.*s", nTerm, term);
    if (!h->term) { sqlite3_free(h); return rc; }
    h->n = *nHit;
    h->next = sizes->hits;
    sizes->hits = h;
    sizes->nHits++;
  }
  return rc;
}

/* As fts5_aux.c's fts5Bm25GetData: phrases, average row size, each scored phrase's IDF, and
** the order they are summed in (`list`: aokun_bm25's third argument, or NULL). */
static int get_data(const Fts5ExtensionApi *api, Fts5Context *fts, const char *table,
                    const char *list, Bm25Data **out) {
  Bm25Data *p = (Bm25Data *)api->xGetAuxdata(fts, 0);
  int rc = SQLITE_OK, i, j, nPhrase;
  sqlite3_int64 nRow = 0, nToken = 0;
  const char *at = list, **term;
  int *nTerm;
  /* per phrase: IDF, frequency, the list's term and order, the term's length (any count of them) */
  const size_t each = sizeof(double) * 2 + sizeof(char *) + sizeof(int) * 2;
  if (p) { *out = p; return SQLITE_OK; }
  nPhrase = api->xPhraseCount(fts);
  p = sqlite3_malloc64(sizeof(Bm25Data) + each * (sqlite3_uint64)nPhrase);
  if (!p) return SQLITE_NOMEM;
  memset(p, 0, sizeof(Bm25Data) + each * (size_t)nPhrase);
  p->nPhrase = nPhrase;
  p->aIDF = (double *)&p[1];
  p->aFreq = &p->aIDF[nPhrase];
  term = (const char **)&p->aFreq[nPhrase];
  p->aOrder = (int *)&term[nPhrase];
  nTerm = &p->aOrder[nPhrase];
  for (j = 0; at && *at && j < nPhrase; j++) { /* "i term\n" lines */
    char *end;
    long ix = strtol(at, &end, 10);
    const char *eol = strchr(end, '\n');
    if (end == at || *end != ' ' || ix < 0 || ix >= nPhrase) { rc = SQLITE_ERROR; break; }
    p->aOrder[j] = (int)ix;
    term[j] = end + 1;
    nTerm[j] = (int)(eol ? eol - end - 1 : (long)strlen(end + 1));
    at = eol ? eol + 1 : 0;
  }
  if (rc == SQLITE_OK && at && *at) rc = SQLITE_ERROR; /* more lines than phrases */
  p->nOrder = list ? j : nPhrase;
  for (j = 0; !list && j < nPhrase; j++) p->aOrder[j] = j;
  if (rc == SQLITE_OK) rc = api->xRowCount(fts, &nRow);
  if (rc == SQLITE_OK) rc = api->xColumnTotalSize(fts, -1, &nToken);
  if (rc == SQLITE_OK) {
    p->avgdl = (double)nToken / (double)nRow;
    p->sizes = sizes_of((Cache *)api->xUserData(fts), table, nRow, &p->stale);
  }
  for (j = 0; rc == SQLITE_OK && j < p->nOrder; j++) {
    sqlite3_int64 nHit = 0;
    i = p->aOrder[j];
    rc = phrase_hits(api, fts, p->sizes, i, term[j], nTerm[j], &nHit);
    if (rc == SQLITE_OK) {
      double idf = log((nRow - nHit + 0.5) / (nHit + 0.5));
      if (idf <= 0.0) idf = 1e-6;
      p->aIDF[i] = idf;
    }
  }
  if (rc == SQLITE_OK) rc = api->xSetAuxdata(fts, p, sqlite3_free);
  else sqlite3_free(p);
  if (rc == SQLITE_OK) *out = p;
  return rc;
}

/* aokun_bm25(tbl, 'tbl' [, phrases]): as fts5_aux.c's fts5Bm25Function, every column weighing 1. */
static void aokun_bm25(const Fts5ExtensionApi *api, Fts5Context *fts, sqlite3_context *ctx,
                       int nVal, sqlite3_value **apVal) {
  const double k1 = 1.2, b = 0.75;
  Bm25Data *p = 0;
  double score = 0.0, D = 0.0;
  int rc, i;
  const char *table = nVal > 0 ? (const char *)sqlite3_value_text(apVal[0]) : 0;
  const char *list = nVal > 1 ? (const char *)sqlite3_value_text(apVal[1]) : 0;
  rc = get_data(api, fts, table, list, &p);
  /* each scored phrase's instances in this row, from its own position list (xInstCount would
  ** merge every phrase's, the MATCH expression's repeats too, into one list first) */
  for (int j = 0; rc == SQLITE_OK && j < p->nOrder; j++) {
    Fts5PhraseIter it;
    int ic, io, n = 0;
    rc = api->xPhraseFirst(fts, p->aOrder[j], &it, &ic, &io);
    for (; rc == SQLITE_OK && ic >= 0; api->xPhraseNext(fts, &it, &ic, &io)) n++;
    p->aFreq[p->aOrder[j]] = n;
  }
  if (rc == SQLITE_OK) {
    sqlite3_int64 id = api->xRowid(fts);
    int nTok = -1;
    if (p->sizes && id >= 0 && id < p->sizes->n) nTok = p->sizes->size[id];
    if (nTok < 0) {
      rc = api->xColumnSize(fts, -1, &nTok);
      if (p->stale) p->stale->debt++;
    }
    D = (double)nTok;
  }
  for (int j = 0; rc == SQLITE_OK && j < p->nOrder; j++) {
    i = p->aOrder[j];
    score += p->aIDF[i] * ((p->aFreq[i] * (k1 + 1.0))
                           / (p->aFreq[i] + k1 * (1 - b + b * D / p->avgdl)));
  }
  if (rc == SQLITE_OK) sqlite3_result_double(ctx, -1.0 * score);
  else sqlite3_result_error_code(ctx, rc);
}

/* aokun_rank_warm('tbl'): take the copy of the table's sizes now (a new process's first searches
** would otherwise size their rows through FTS5 until they add up to a quarter of the table); 1 when
** the copy is current, else 0. */
static void aokun_rank_warm(sqlite3_context *ctx, int nVal, sqlite3_value **apVal) {
  Sizes *stale = 0;
  const char *table = nVal > 0 ? (const char *)sqlite3_value_text(apVal[0]) : 0;
  sqlite3_result_int(ctx, sizes_of((Cache *)sqlite3_user_data(ctx), table, 0, &stale) != 0);
}

#ifdef _WIN32
__declspec(dllexport)
#endif
int sqlite3_fts5rank_init(sqlite3 *db, char **pzErrMsg, const sqlite3_api_routines *pApi) {
  fts5_api *fts = 0;
  sqlite3_stmt *st = 0;
  Cache *c;
  int rc;
  SQLITE_EXTENSION_INIT2(pApi);
  (void)pzErrMsg;
  rc = sqlite3_prepare_v2(db, "select fts5(?1)", -1, &st, 0);
  if (rc == SQLITE_OK) {
    sqlite3_bind_pointer(st, 1, (void *)&fts, "fts5_api_ptr", 0);
    sqlite3_step(st);
    rc = sqlite3_finalize(st);
  }
  if (rc != SQLITE_OK || !fts || fts->iVersion < 2) return rc != SQLITE_OK ? rc : SQLITE_ERROR;
  c = sqlite3_malloc(sizeof(Cache));
  if (!c) return SQLITE_NOMEM;
  c->db = db;
  c->tables = 0;
  rc = sqlite3_create_function(db, "aokun_rank_warm", 1, SQLITE_UTF8, c, aokun_rank_warm, 0, 0);
  if (rc != SQLITE_OK) { sqlite3_free(c); return rc; }
  return fts->xCreateFunction(fts, "aokun_bm25", c, aokun_bm25, cache_free);
}

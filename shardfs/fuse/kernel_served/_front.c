/*
 * _front.c - the native front of a kernel-served mount (see docs/design.md, "The native
 * front").
 *
 * A thread that reads /dev/fuse itself and answers, from tables that Python filled, the
 * requests a first read of a chunk file costs: LOOKUP of a chunk file in a prepared
 * directory, GETATTR and READ of a chunk file's node id; and the READDIRPLUS requests that
 * page on through a listing Python took (its chunk files, with the rows Python made ready
 * for its own reply: the same listing, as Python would answer). It passes every other request,
 * and every one the tables cannot vouch for, to pyfuse3's loop unchanged, one per message
 * of a SOCK_SEQPACKET socket (pyfuse3 patched: patches/pyfuse3-3.5.0-front-channel.patch);
 * replies go to the device from both sides. Python stays the only decider: a row here is
 * what Python's lookup found for one version of a shard, and the front answers with it
 * only while a stat of the source finds that version (and the array's document at the
 * version the row was made under). Whatever else is true, the request goes to Python.
 *
 * Node ids follow InodeTable's rule (one node id, one version): a row's node id is its
 * slot's, which Python made for exactly that version. The kernel's references to a slot
 * are counted on both sides: lookups answered here count here, the rest in Python.
 * FORGET goes to Python, which takes this side's count over when its own reaches zero,
 * and drops the slot's rows here in the same step (`retire`), under the tables' lock, so
 * that no lookup can hand out a node id of a slot that is being let go.
 *
 * Reads are served from a descriptor of the version, duplicated from the one Python
 * keeps, with preadv2(RWF_NOWAIT): page-cache hits only, so that no disk read stalls the
 * requests behind it. A miss goes to one of a few worker threads, which reads it from
 * the disk (and asks the kernel to read ahead in the shard). A short read, or a file that
 * a fstat after the read finds changed, goes to Python, which reads it (or fails with
 * EIO, the version being gone).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef RWF_NOWAIT
#define RWF_NOWAIT 0x00000008
#endif

/* The biggest request the kernel sends: max_write (1 MiB at most, max_pages 256) plus a
   page for headers; a read buffer smaller than the connection's max_write is refused. */
#define REQUEST_BUFFER ((1 << 20) + 4096 * 2)
/* The biggest reply of a READ this front makes (max_read: 1 MiB at most). */
#define READ_BUFFER (1 << 20)
/* A forwarded BATCH_FORGET is cut into messages of at most this many entries: a socket's
   biggest message is its send buffer, which an ordinary user cannot raise past wmem_max. */
#define FORGETS_PER_MESSAGE 2048
/* Rows at most (about 150 bytes each with their names and the allocator's share): a fill
   beyond drops the rows of other slots until a quarter is free (their requests go to
   Python, which may fill them again); a fill bigger than all is refused. */
#define ROWS_MAX (1 << 18)
/* Prepared directories at most: beyond, all of them are dropped. (Kept versions, each a
   descriptor, are bounded by the caller: `kept_max`.) */
#define DIRS_MAX 4096
/* Listings at most, and their positions at most (8 bytes each): beyond, all are dropped
   (Python keeps fewer: INODE_LISTINGS). */
#define LISTINGS_MAX 1024
#define POSITIONS_MAX (1 << 22)
/* Threads that read what is not in the page cache, and reads waiting for them at most
   (beyond, a read goes to Python); bytes asked to be read ahead in a shard at a miss. */
#define WORKERS 4
#define JOBS_MAX 256
#define READ_AHEAD (4 << 20)

typedef struct {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
} version_t;

/* One shard version Python keeps readable, with a descriptor of its own. */
struct kept {
    struct kept *next;
    uint64_t id;
    int fd;      /* closed once dropped and no worker reads it (-1 then) */
    int dropped; /* no longer kept by Python: reads go to Python, which answers EIO */
    int busy;    /* workers reading it */
    char *path;
    version_t v;
    double shown_at;
    uint64_t rows;
    uint64_t advised_end; /* read ahead up to here */
};

/* A read a worker does from the disk: the request is kept to pass it on if it fails. */
struct job {
    struct job *next;
    struct kept *k;
    uint64_t unique, offset;
    size_t want, n;
    int advise;
    char request[];
};

/* A prepared directory (by node id) and the version of its array's document. */
struct dir {
    struct dir *next;
    uint64_t nodeid;
    char *doc_path;
    version_t doc;
    struct row *current; /* its rows in the name table (next_in_dir) */
};

/* A slot (one version of an array's chunks stored in one shard): the kernel's references
   counted here, and its rows. */
struct slot {
    struct slot *next;
    uint64_t slot;
    uint64_t refs;
    uint64_t listed; /* listings that hold rows of it */
    struct row *rows; /* next_in_slot */
};

/* A listing Python took of a directory (by node id), from the position where its chunk
   files are: the rows at each position, where Python made them ready (NULL elsewhere:
   Python answers from there), and the slots of those rows (each counted in its `listed`,
   and the listing dropped before a slot's rows are freed). */
struct listing {
    struct listing *next;
    uint64_t nodeid;
    /* Made ahead of the kernel's read (Python's reply did not start it): answered from
       position 0 too, while each file it was made from is still the version it was (or
       still absent: `absent`). */
    int ahead;
    size_t ndeps;
    struct dep {
        char *path;
        int absent, dir;
        version_t v;
    } *deps;
    uint64_t total;   /* positions in the listing: the end */
    uint64_t first;   /* the first position of `at` */
    struct row **at;  /* total - first */
    struct slot **slots;
    size_t nslots, slots_size;
};

struct row {
    struct row *next_name, *next_node, *next_in_slot, *next_in_dir;
    uint64_t parent, nodeid, name_hash;
    struct kept *kept;
    struct slot *slot;
    uint64_t offset, length;
    int64_t mtime_ns;
    uint32_t mode, uid, gid;
    int in_names;
    uint16_t namelen;
    char name[];
};

/* Chained hash tables keyed by 64-bit numbers; each holds its items' `next` link at the
   offset given. */
typedef struct {
    void **buckets;
    size_t size, count, link;
} table_t;

static void **link_of(table_t *t, void *item) { return (void **)((char *)item + t->link); }

static int table_init(table_t *t, size_t link)
{
    t->size = 1024;
    t->count = 0;
    t->link = link;
    t->buckets = calloc(t->size, sizeof(void *));
    return t->buckets ? 0 : -1;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

typedef uint64_t (*key_fn)(void *);

static void table_grow(table_t *t, key_fn key)
{
    size_t size = t->size * 2;
    void **buckets = calloc(size, sizeof(void *));
    if (!buckets)
        return; /* stays slower, still right */
    for (size_t i = 0; i < t->size; i++) {
        void *item = t->buckets[i];
        while (item) {
            void *next = *link_of(t, item);
            size_t b = mix(key(item)) & (size - 1);
            *link_of(t, item) = buckets[b];
            buckets[b] = item;
            item = next;
        }
    }
    free(t->buckets);
    t->buckets = buckets;
    t->size = size;
}

static void table_put(table_t *t, void *item, key_fn key)
{
    if (t->count >= t->size)
        table_grow(t, key);
    size_t b = mix(key(item)) & (t->size - 1);
    *link_of(t, item) = t->buckets[b];
    t->buckets[b] = item;
    t->count++;
}

static void table_remove(table_t *t, void *item, key_fn key)
{
    void **at = &t->buckets[mix(key(item)) & (t->size - 1)];
    while (*at) {
        if (*at == item) {
            *at = *link_of(t, item);
            t->count--;
            return;
        }
        at = link_of(t, *at);
    }
}

static void *table_first(table_t *t, uint64_t k) { return t->buckets[mix(k) & (t->size - 1)]; }

/* Free a table, and each of its items with `free_item` (none if NULL). */
static void table_free(table_t *t, void (*free_item)(void *))
{
    for (size_t i = 0; free_item && t->buckets && i < t->size; i++) {
        void *item = t->buckets[i];
        while (item) {
            void *next = *link_of(t, item);
            free_item(item);
            item = next;
        }
    }
    free(t->buckets);
    t->buckets = NULL;
}

static void free_dir(void *p)
{
    free(((struct dir *)p)->doc_path);
    free(p);
}

static void free_kept(void *p)
{
    struct kept *k = p;
    if (k->fd >= 0)
        close(k->fd);
    free(k->path);
    free(k);
}

static uint64_t kept_key(void *p) { return ((struct kept *)p)->id; }
static uint64_t dir_key(void *p) { return ((struct dir *)p)->nodeid; }
static uint64_t slot_key(void *p) { return ((struct slot *)p)->slot; }
static uint64_t node_key(void *p) { return ((struct row *)p)->nodeid; }
static uint64_t name_key(void *p) { return ((struct row *)p)->name_hash; }
static uint64_t listing_key(void *p) { return ((struct listing *)p)->nodeid; }

/* The item of table `t` whose key (as `key` tells) is `k`, or NULL. */
static void *table_find(table_t *t, uint64_t k, key_fn key)
{
    for (void *item = table_first(t, k); item; item = *link_of(t, item))
        if (key(item) == k)
            return item;
    return NULL;
}

static uint64_t name_hash(uint64_t parent, const char *name, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ parent;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 0x100000001b3ULL;
    return h;
}

enum { K_LOOKUP, K_GETATTR, K_READ, K_READDIRPLUS, K_IOCTL, K_OTHER, KINDS };
static const char *kind_names[KINDS] = {"lookup", "getattr", "read", "readdirplus", "ioctl",
                                        "other"};
/* Requests passed on are counted by opcode (those beyond OPCODES as the last). */
#define OPCODES 64

static const char *opcode_name(int op)
{
    switch (op) {
    case FUSE_LOOKUP: return "lookup";
    case FUSE_FORGET: return "forget";
    case FUSE_GETATTR: return "getattr";
    case FUSE_READLINK: return "readlink";
    case FUSE_OPEN: return "open";
    case FUSE_READ: return "read";
    case FUSE_STATFS: return "statfs";
    case FUSE_RELEASE: return "release";
    case FUSE_GETXATTR: return "getxattr";
    case FUSE_LISTXATTR: return "listxattr";
    case FUSE_FLUSH: return "flush";
    case FUSE_INIT: return "init";
    case FUSE_OPENDIR: return "opendir";
    case FUSE_READDIR: return "readdir";
    case FUSE_RELEASEDIR: return "releasedir";
    case FUSE_ACCESS: return "access";
    case FUSE_INTERRUPT: return "interrupt";
    case FUSE_DESTROY: return "destroy";
    case FUSE_BATCH_FORGET: return "batch_forget";
    case FUSE_READDIRPLUS: return "readdirplus";
    case FUSE_LSEEK: return "lseek";
    default: return NULL;
    }
}
enum { M_NO_ROW, M_CHANGED, M_NOT_CACHED, M_DROPPED, M_ERROR, MISSES };
static const char *miss_names[MISSES] = {"no row", "changed", "not cached", "dropped", "error"};

typedef struct {
    PyObject_HEAD
    int dev;     /* our own duplicate of the session's /dev/fuse descriptor */
    int ours;    /* the front's end of the channel */
    int theirs;  /* pyfuse3's end */
    pthread_t thread;
    int started, running;
    pthread_mutex_t lock;
    table_t kept, dirs, slots, nodes, names, listings;
    uint64_t rows, positions;
    size_t rows_max; /* ROWS_MAX, or fewer (tests) */
    size_t kept_max, open_fds;
    uint64_t timeout_s;
    uint32_t timeout_ns;
    int minor; /* of the kernel's INIT: 0 until seen */
    uint64_t answered[KINDS];
    uint64_t passed[OPCODES];
    uint64_t misses[MISSES];
    uint64_t disk_reads;
    pthread_t workers[WORKERS];
    int nworkers, stopping;
    pthread_cond_t work;
    struct job *jobs, *last_job;
    size_t queued;
    char *request, *reply;
} Front;

static double monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Whether `st` is version `v` of a regular file, or of a directory if `dir`. */
static int same_stat(const struct stat *st, const version_t *v, int dir)
{
    return (uint64_t)st->st_dev == v->dev && (uint64_t)st->st_ino == v->ino
        && (uint64_t)st->st_size == v->size
        && (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec == v->mtime_ns
        && (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec == v->ctime_ns
        && (dir ? S_ISDIR(st->st_mode) : S_ISREG(st->st_mode));
}

static int same_version(const struct stat *st, const version_t *v) { return same_stat(st, v, 0); }

/* Whether the file at `path` is exactly version `v` now (symlinks are not followed: they
   are not part of a source). */
static int still(const char *path, const version_t *v)
{
    struct stat st;
    return lstat(path, &st) == 0 && same_version(&st, v);
}

static void send_reply(Front *f, uint64_t unique, int error, const void *body, size_t len)
{
    struct fuse_out_header out = {.len = sizeof(out) + len, .error = error, .unique = unique};
    struct iovec iov[2] = {{&out, sizeof(out)}, {(void *)body, len}};
    /* ENOENT: the request was interrupted meanwhile; nothing else can be done either way */
    (void)!writev(f->dev, iov, len ? 2 : 1);
}

static void fill_attr(struct fuse_attr *a, const struct row *r)
{
    memset(a, 0, sizeof(*a));
    a->ino = r->nodeid;
    a->size = r->length;
    a->blocks = (r->length + 511) / 512;
    a->atime = a->mtime = a->ctime = r->mtime_ns / 1000000000;
    a->atimensec = a->mtimensec = a->ctimensec = r->mtime_ns % 1000000000;
    a->mode = r->mode;
    a->nlink = 1;
    a->uid = r->uid;
    a->gid = r->gid;
    a->blksize = 65536;
}

static struct row *row_by_node(Front *f, uint64_t nodeid)
{
    return table_find(&f->nodes, nodeid, node_key);
}

static struct row *row_by_name(Front *f, uint64_t parent, const char *name, size_t len)
{
    uint64_t h = name_hash(parent, name, len);
    for (struct row *r = table_first(&f->names, h); r; r = r->next_name)
        if (r->name_hash == h && r->parent == parent && r->namelen == len
            && memcmp(r->name, name, len) == 0)
            return r;
    return NULL;
}

static struct dir *dir_by_node(Front *f, uint64_t nodeid)
{
    return table_find(&f->dirs, nodeid, dir_key);
}

static struct kept *kept_by_id(Front *f, uint64_t id)
{
    return table_find(&f->kept, id, kept_key);
}

static struct slot *slot_by_number(Front *f, uint64_t n)
{
    return table_find(&f->slots, n, slot_key);
}

static struct listing *listing_by_node(Front *f, uint64_t nodeid)
{
    return table_find(&f->listings, nodeid, listing_key);
}

static void free_deps(struct dep *deps, size_t n)
{
    for (size_t i = 0; deps && i < n; i++)
        free(deps[i].path);
    free(deps);
}

/* Whether every file a listing made ahead was made from is as it was then. */
static int deps_hold(const struct listing *l)
{
    for (size_t i = 0; i < l->ndeps; i++) {
        const struct dep *d = &l->deps[i];
        struct stat st;
        int found = lstat(d->path, &st) == 0;
        if (d->absent ? found || errno != ENOENT : !found || !same_stat(&st, &d->v, d->dir))
            return 0;
    }
    return 1;
}

static void drop_listing(Front *f, struct listing *l)
{
    for (size_t i = 0; i < l->nslots; i++)
        l->slots[i]->listed--;
    free_deps(l->deps, l->ndeps);
    table_remove(&f->listings, l, listing_key);
    f->positions -= l->total - l->first;
    free(l->slots);
    free(l->at);
    free(l);
}

static void drop_all_listings(Front *f)
{
    for (size_t i = 0; i < f->listings.size; i++)
        while (f->listings.buckets[i])
            drop_listing(f, f->listings.buckets[i]);
}

/* Drop the listings holding rows of `s` (before its rows are freed). */
static void unlist_slot(Front *f, struct slot *s)
{
    for (size_t i = 0; s->listed && i < f->listings.size; i++) {
        struct listing *l = f->listings.buckets[i];
        while (l) {
            struct listing *next = l->next;
            for (size_t k = 0; k < l->nslots; k++)
                if (l->slots[k] == s) {
                    drop_listing(f, l);
                    break;
                }
            l = next;
        }
    }
}

/* Count `s` as held by `l`: 0, or -1 if out of memory (then the row is not listed). */
static int list_slot(struct listing *l, struct slot *s)
{
    for (size_t k = l->nslots; k-- > 0;)
        if (l->slots[k] == s)
            return 0;
    if (l->nslots == l->slots_size) {
        size_t size = l->slots_size ? l->slots_size * 2 : 4;
        struct slot **slots = realloc(l->slots, size * sizeof(*slots));
        if (!slots)
            return -1;
        l->slots = slots;
        l->slots_size = size;
    }
    l->slots[l->nslots++] = s;
    s->listed++;
    return 0;
}

/* Take a row out of the name table (a newer version's row, or its directory, replaces it). */
static void unname(Front *f, struct row *r)
{
    if (!r->in_names)
        return;
    table_remove(&f->names, r, name_key);
    r->in_names = 0;
}

static void undir(Front *f, struct row *r);

/* Answer lookups of `r`'s name in `d` (its directory) with `r`, in place of the row
   that name had. */
static void name_row(Front *f, struct dir *d, struct row *r)
{
    struct row *old = row_by_name(f, d->nodeid, r->name, r->namelen);
    if (old) {
        unname(f, old);
        undir(f, old);
    }
    r->next_in_dir = d->current;
    d->current = r;
    table_put(&f->names, r, name_key);
    r->in_names = 1;
}

/* Unlink `r` from its directory's list of named rows. */
static void undir(Front *f, struct row *r)
{
    struct dir *d = dir_by_node(f, r->parent);
    if (!d)
        return;
    for (struct row **at = &d->current; *at; at = &(*at)->next_in_dir)
        if (*at == r) {
            *at = r->next_in_dir;
            return;
        }
}

static void drop_dir(Front *f, struct dir *d)
{
    for (struct row *r = d->current; r; r = r->next_in_dir)
        unname(f, r);
    table_remove(&f->dirs, d, dir_key);
    free(d->doc_path);
    free(d);
}

/* Free `k` if nothing needs it: no row names it, Python let it go, no worker reads it. */
static void release_kept(Front *f, struct kept *k)
{
    if (--k->rows || !k->dropped || k->busy)
        return;
    table_remove(&f->kept, k, kept_key);
    free(k->path);
    free(k);
}

/* Take every row of slot `s` out of the tables (the listings holding any dropped first);
   the slot stays. Its rows, chained by next_in_slot, are the caller's to free. */
static struct row *unlink_rows(Front *f, struct slot *s)
{
    unlist_slot(f, s);
    struct row *rows = s->rows;
    for (struct row *r = rows; r; r = r->next_in_slot) {
        unname(f, r);
        undir(f, r);
        table_remove(&f->nodes, r, node_key);
        f->rows--;
        release_kept(f, r->kept);
    }
    s->rows = NULL;
    return rows;
}

static void free_rows(struct row *rows)
{
    while (rows) {
        struct row *next = rows->next_in_slot;
        free(rows);
        rows = next;
    }
}

/* Room for `n` rows more: the rows of slots other than `keep` dropped until at most three
   quarters of the front's `rows_max` are left (the kernel's references stay counted in
   their slots). */
static void make_room(Front *f, struct slot *keep, size_t n)
{
    for (size_t i = 0; i < f->slots.size && f->rows + n > f->rows_max / 4 * 3; i++)
        for (struct slot *s = f->slots.buckets[i]; s; s = s->next)
            if (s != keep && s->rows)
                free_rows(unlink_rows(f, s));
}

/* -- answering ------------------------------------------------------------------------ */

static int answer_lookup(Front *f, struct fuse_in_header *in, const char *name, size_t len)
{
    struct dir *d = dir_by_node(f, in->nodeid);
    if (!d)
        return 0;
    struct row *r = row_by_name(f, in->nodeid, name, len);
    if (!r) {
        f->misses[M_NO_ROW]++;
        return 0;
    }
    struct kept *k = r->kept;
    if (k->dropped) {
        f->misses[M_DROPPED]++;
        return 0;
    }
    if (!still(d->doc_path, &d->doc) || !still(k->path, &k->v)) {
        f->misses[M_CHANGED]++;
        return 0;
    }
    struct fuse_entry_out e = {
        .nodeid = r->nodeid,
        .entry_valid = f->timeout_s,
        .attr_valid = f->timeout_s,
        .entry_valid_nsec = f->timeout_ns,
        .attr_valid_nsec = f->timeout_ns,
    };
    fill_attr(&e.attr, r);
    r->slot->refs++; /* before the reply: the kernel holds it from then on */
    k->shown_at = monotonic();
    send_reply(f, in->unique, 0, &e, sizeof(e));
    return 1;
}

static int answer_getattr(Front *f, struct fuse_in_header *in)
{
    struct row *r = row_by_node(f, in->nodeid);
    if (!r)
        return 0;
    /* A node id names one version: its attributes never change. */
    struct fuse_attr_out a = {.attr_valid = f->timeout_s, .attr_valid_nsec = f->timeout_ns};
    fill_attr(&a.attr, r);
    send_reply(f, in->unique, 0, &a, sizeof(a));
    return 1;
}

/* Hand a read that missed the page cache to a worker: whether one took it. */
static int queue_read(Front *f, struct fuse_in_header *in, size_t n, struct kept *k,
                      uint64_t offset, size_t want)
{
    if (!f->nworkers || f->queued >= JOBS_MAX || f->stopping)
        return 0;
    struct job *j = malloc(sizeof(*j) + n);
    if (!j)
        return 0;
    *j = (struct job){.k = k, .unique = in->unique, .offset = offset, .want = want, .n = n};
    memcpy(j->request, in, n);
    if (offset + want > k->advised_end || offset < k->advised_end - READ_AHEAD) {
        j->advise = 1; /* the chunks after it in the shard are read next, mostly */
        k->advised_end = offset + READ_AHEAD;
    }
    k->busy++;
    if (f->last_job)
        f->last_job->next = j;
    else
        f->jobs = j;
    f->last_job = j;
    f->queued++;
    pthread_cond_signal(&f->work);
    return 1;
}

static int forward(Front *f, char *buf, size_t n);

static void *work(void *arg)
{
    Front *f = arg;
    pthread_setname_np(pthread_self(), "shardfs-reader"); /* as `top -H` shows it */
    char *buf = malloc(READ_BUFFER);
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->jobs && !f->stopping)
            pthread_cond_wait(&f->work, &f->lock);
        struct job *j = f->jobs;
        if (!j)
            break;
        f->jobs = j->next;
        if (!f->jobs)
            f->last_job = NULL;
        f->queued--;
        struct kept *k = j->k;
        int fd = k->fd; /* open while busy */
        pthread_mutex_unlock(&f->lock);
        if (j->advise)
            posix_fadvise(fd, j->offset, READ_AHEAD, POSIX_FADV_WILLNEED);
        ssize_t got = buf ? pread(fd, buf, j->want, (off_t)j->offset) : -1;
        struct stat st;
        int ok = got == (ssize_t)j->want && fstat(fd, &st) == 0 && same_version(&st, &k->v);
        if (ok)
            send_reply(f, j->unique, 0, buf, j->want);
        pthread_mutex_lock(&f->lock);
        f->disk_reads += ok;
        if (!ok)
            f->misses[M_CHANGED]++;
        int closing = --k->busy == 0 && k->dropped ? k->fd : -1;
        if (closing >= 0) {
            k->fd = -1;
            f->open_fds--;
            k->rows++; /* released right below: freed if no row names it */
            release_kept(f, k);
        }
        pthread_mutex_unlock(&f->lock);
        if (closing >= 0)
            close(closing);
        if (!ok)
            forward(f, j->request, j->n); /* Python reads it, or answers EIO */
        free(j);
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    free(buf);
    return NULL;
}

static int answer_read(Front *f, struct fuse_in_header *in, size_t n, const struct fuse_read_in *rd)
{
    struct row *r = row_by_node(f, in->nodeid);
    if (!r)
        return 0;
    struct kept *k = r->kept;
    if (k->dropped) {
        f->misses[M_DROPPED]++;
        return 0;
    }
    size_t want = 0;
    if (rd->offset < r->length) {
        want = r->length - rd->offset;
        if (want > rd->size)
            want = rd->size;
        if (want > READ_BUFFER)
            return 0;
    }
    if (want) {
        struct iovec iov = {f->reply, want};
        uint64_t at = r->offset + rd->offset;
        ssize_t got = preadv2(k->fd, &iov, 1, (off_t)at, RWF_NOWAIT);
        if (got < 0 && errno == EAGAIN && queue_read(f, in, n, k, at, want))
            return 1;
        if (got != (ssize_t)want) {
            f->misses[got < 0 && errno == EAGAIN ? M_NOT_CACHED : M_ERROR]++;
            return 0;
        }
        /* Checked after the read, so that a change during it is seen too (as Python's
           pins do); a changed file goes to Python, which knows whether it still holds
           the version's bytes. */
        struct stat st;
        if (fstat(k->fd, &st) != 0 || !same_version(&st, &k->v)) {
            f->misses[M_CHANGED]++;
            return 0;
        }
    }
    send_reply(f, in->unique, 0, f->reply, want);
    return 1;
}

/* A page of a listing from `rd->offset` on (a position: the entries before it were sent),
   as far as Python made rows ready there, each entry a reference of the kernel's to its
   node id. The end of the listing is an empty page. A read from 0 goes to Python, which
   takes the listing afresh, unless the listing was made ahead and still holds. */
static int answer_readdirplus(Front *f, struct fuse_in_header *in, const struct fuse_read_in *rd)
{
    struct listing *l = listing_by_node(f, in->nodeid);
    if (!l || rd->fh != 0 || rd->offset < l->first || rd->offset > l->total)
        return 0;
    if (!rd->offset && !(l->ahead && deps_hold(l))) {
        f->misses[M_CHANGED] += l->ahead;
        return 0;
    }
    size_t size = rd->size < READ_BUFFER ? rd->size : READ_BUFFER, used = 0;
    uint64_t pos = rd->offset;
    double now = monotonic();
    for (; pos < l->total; pos++) {
        struct row *r = l->at[pos - l->first];
        if (!r || r->kept->dropped)
            break; /* Python answers from here */
        size_t len = FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET_DIRENTPLUS + r->namelen);
        if (used + len > size)
            break;
        struct fuse_direntplus *e = (struct fuse_direntplus *)(f->reply + used);
        memset(e, 0, len);
        e->entry_out = (struct fuse_entry_out){
            .nodeid = r->nodeid,
            .entry_valid = f->timeout_s,
            .attr_valid = f->timeout_s,
            .entry_valid_nsec = f->timeout_ns,
            .attr_valid_nsec = f->timeout_ns,
        };
        fill_attr(&e->entry_out.attr, r);
        e->dirent.ino = r->nodeid;
        e->dirent.off = pos + 1;
        e->dirent.namelen = r->namelen;
        e->dirent.type = DT_REG;
        memcpy(e->dirent.name, r->name, r->namelen);
        r->slot->refs++; /* before the reply: the kernel holds it from then on */
        r->kept->shown_at = now;
        used += len;
    }
    if (!used && pos < l->total) {
        f->misses[M_NO_ROW]++;
        return 0;
    }
    send_reply(f, in->unique, 0, f->reply, used);
    return 1;
}

/* Whether the front answered `in` itself; under the tables' lock. */
static int answer(Front *f, struct fuse_in_header *in, size_t n, int *kind)
{
    const char *body = (const char *)(in + 1);
    size_t body_len = n - sizeof(*in);
    switch (in->opcode) {
    case FUSE_LOOKUP: {
        *kind = K_LOOKUP;
        size_t len = strnlen(body, body_len);
        return len < body_len && answer_lookup(f, in, body, len);
    }
    case FUSE_GETATTR:
        *kind = K_GETATTR;
        return answer_getattr(f, in);
    case FUSE_READ:
        *kind = K_READ;
        return body_len >= sizeof(struct fuse_read_in)
            && answer_read(f, in, n, (const struct fuse_read_in *)body);
    case FUSE_READDIRPLUS:
        *kind = K_READDIRPLUS;
        return body_len >= sizeof(struct fuse_read_in)
            && answer_readdirplus(f, in, (const struct fuse_read_in *)body);
    case FUSE_IOCTL:
        /* What libfuse answers for pyfuse3, which implements no ioctl; every open of a
           file by Python's io.open asks one (isatty), and the kernel does not remember. */
        *kind = K_IOCTL;
        send_reply(f, in->unique, -ENOSYS, NULL, 0);
        return 1;
    default:
        *kind = K_OTHER;
        return 0;
    }
}

/* Pass a request on to pyfuse3, a big BATCH_FORGET in pieces. 0, or -1 if the channel
   is gone. */
static int forward(Front *f, char *buf, size_t n)
{
    struct fuse_in_header *in = (struct fuse_in_header *)buf;
    size_t head = sizeof(*in) + sizeof(struct fuse_batch_forget_in);
    if (in->opcode == FUSE_BATCH_FORGET && n >= head) {
        struct fuse_batch_forget_in *b = (struct fuse_batch_forget_in *)(in + 1);
        uint32_t count = b->count;
        if ((n - head) / sizeof(struct fuse_forget_one) < count)
            count = (n - head) / sizeof(struct fuse_forget_one);
        struct fuse_forget_one *items = (struct fuse_forget_one *)(buf + head);
        for (uint32_t done = 0; done < count || done == 0;) {
            uint32_t part = count - done < FORGETS_PER_MESSAGE ? count - done : FORGETS_PER_MESSAGE;
            struct fuse_in_header h = *in;
            struct fuse_batch_forget_in bh = {.count = part};
            h.len = head + part * sizeof(struct fuse_forget_one);
            struct iovec iov[3] = {{&h, sizeof(h)}, {&bh, sizeof(bh)},
                                   {items + done, part * sizeof(struct fuse_forget_one)}};
            struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};
            while (sendmsg(f->ours, &msg, MSG_NOSIGNAL) < 0)
                if (errno != EINTR)
                    return -1;
            done += part;
            if (!count)
                break;
        }
        return 0;
    }
    while (send(f->ours, buf, n, MSG_NOSIGNAL) < 0) {
        if (errno == EINTR)
            continue;
        if (errno == EMSGSIZE) {
            send_reply(f, in->unique, -EIO, NULL, 0);
            return 0;
        }
        return -1;
    }
    return 0;
}

static void *serve(void *arg)
{
    Front *f = arg;
    pthread_setname_np(pthread_self(), "shardfs-front");
    for (;;) {
        ssize_t n = read(f->dev, f->request, REQUEST_BUFFER);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ENOENT)
                continue; /* ENOENT: a request interrupted before it was read */
            break;        /* ENODEV: unmounted */
        }
        if ((size_t)n < sizeof(struct fuse_in_header))
            continue;
        struct fuse_in_header *in = (struct fuse_in_header *)f->request;
        int kind = K_OTHER, done = 0;
        if (in->opcode == FUSE_INIT && (size_t)n >= sizeof(*in) + 8) {
            uint32_t major_minor[2];
            memcpy(major_minor, in + 1, 8);
            /* the structures answered here are those of 7.9 on */
            f->minor = major_minor[0] == 7 && major_minor[1] >= 9 ? (int)major_minor[1] : -1;
        } else if (f->minor > 0) {
            pthread_mutex_lock(&f->lock);
            done = answer(f, in, (size_t)n, &kind);
            if (done)
                f->answered[kind]++;
            else
                f->passed[in->opcode < OPCODES ? in->opcode : OPCODES - 1]++;
            pthread_mutex_unlock(&f->lock);
        }
        if (!done && forward(f, f->request, (size_t)n) < 0)
            break;
    }
    /* the workers finish what they were given (their replies fail: unmounted) */
    pthread_mutex_lock(&f->lock);
    f->stopping = 1;
    pthread_cond_broadcast(&f->work);
    pthread_mutex_unlock(&f->lock);
    for (int i = 0; i < f->nworkers; i++)
        pthread_join(f->workers[i], NULL);
    f->nworkers = 0;
    /* pyfuse3 reads the end of the channel as the device's unmount */
    shutdown(f->ours, SHUT_RDWR);
    __atomic_store_n(&f->running, 0, __ATOMIC_RELEASE);
    return NULL;
}

/* -- the Python type ---------------------------------------------------------------- */

static int parse_version(PyObject *t, version_t *v)
{
    unsigned long long dev, ino, size;
    long long mtime, ctime;
    if (!PyArg_ParseTuple(t, "KKKLL", &dev, &ino, &size, &mtime, &ctime))
        return -1;
    *v = (version_t){dev, ino, size, mtime, ctime};
    return 0;
}

static void Front_dealloc(Front *f)
{
    /* The thread must have ended (`stop`); a front never started owns only memory. */
    if (!f->started || !f->running) {
        if (f->listings.buckets)
            drop_all_listings(f);
        table_free(&f->listings, NULL);
        table_free(&f->nodes, free);
        table_free(&f->slots, free);
        table_free(&f->dirs, free_dir);
        table_free(&f->kept, free_kept);
        table_free(&f->names, NULL); /* (its rows are the nodes') */
        free(f->request);
        free(f->reply);
        if (f->dev >= 0)
            close(f->dev);
        if (f->ours >= 0)
            close(f->ours);
        if (f->theirs >= 0)
            close(f->theirs);
        pthread_mutex_destroy(&f->lock);
        pthread_cond_destroy(&f->work);
    }
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static int Front_init(Front *f, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"device", "timeout", "kept_max", "rows_max", NULL};
    int device;
    double timeout;
    Py_ssize_t kept_max, rows_max = ROWS_MAX;
    f->dev = f->ours = f->theirs = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "idn|n", kw, &device, &timeout, &kept_max,
                                     &rows_max))
        return -1;
    if (rows_max < 4 || rows_max > ROWS_MAX) {
        PyErr_SetString(PyExc_ValueError, "rows_max out of range");
        return -1;
    }
    f->rows_max = rows_max;
    if (kept_max < 0) {
        PyErr_SetString(PyExc_ValueError, "kept_max < 0");
        return -1;
    }
    f->kept_max = kept_max;
    if (timeout < 0 || timeout > 1e9) {
        PyErr_SetString(PyExc_ValueError, "timeout out of range");
        return -1;
    }
    f->timeout_s = (uint64_t)timeout;
    f->timeout_ns = (uint32_t)((timeout - (double)f->timeout_s) * 1e9);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->work, NULL);
    if (table_init(&f->kept, offsetof(struct kept, next)) || table_init(&f->dirs, offsetof(struct dir, next))
        || table_init(&f->slots, offsetof(struct slot, next))
        || table_init(&f->nodes, offsetof(struct row, next_node))
        || table_init(&f->names, offsetof(struct row, next_name))
        || table_init(&f->listings, offsetof(struct listing, next))
        || !(f->request = malloc(REQUEST_BUFFER)) || !(f->reply = malloc(READ_BUFFER))) {
        PyErr_NoMemory();
        return -1;
    }
    int pair[2];
    f->dev = fcntl(device, F_DUPFD_CLOEXEC, 3);
    if (f->dev < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    f->ours = pair[0];
    f->theirs = pair[1];
    /* The device's descriptor may be non-blocking (pyfuse3 polls it): the thread blocks. */
    int flags = fcntl(f->dev, F_GETFL);
    if (flags >= 0)
        fcntl(f->dev, F_SETFL, flags & ~O_NONBLOCK);
    return 0;
}

static PyObject *Front_start(Front *f, PyObject *unused)
{
    if (f->started) {
        PyErr_SetString(PyExc_RuntimeError, "the front is started already");
        return NULL;
    }
    f->running = 1;
    for (int i = 0; i < WORKERS; i++) /* fewer if the system refuses: reads go to Python */
        if (pthread_create(&f->workers[f->nworkers], NULL, work, f) == 0)
            f->nworkers++;
    int e = pthread_create(&f->thread, NULL, serve, f);
    if (e) {
        f->running = 0;
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    f->started = 1;
    Py_RETURN_NONE;
}

static PyObject *Front_stop(Front *f, PyObject *unused)
{
    /* After the unmount: the thread's read of the device then fails (ENODEV). If the
       unmount failed, the thread is left to end with the process. */
    if (f->started) {
        struct timespec until;
        int e;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 5;
        Py_BEGIN_ALLOW_THREADS
        e = pthread_timedjoin_np(f->thread, NULL, &until);
        Py_END_ALLOW_THREADS
        if (e)
            Py_RETURN_FALSE;
        f->started = 0;
    }
    Py_RETURN_TRUE;
}

static PyObject *Front_directory(Front *f, PyObject *args)
{
    unsigned long long nodeid;
    PyObject *path, *version;
    version_t v;
    if (!PyArg_ParseTuple(args, "KO!O!", &nodeid, &PyBytes_Type, &path, &PyTuple_Type, &version)
        || parse_version(version, &v) < 0)
        return NULL;
    char *doc = strdup(PyBytes_AS_STRING(path));
    struct dir *d = calloc(1, sizeof(*d));
    if (!doc || !d) {
        free(doc);
        free(d);
        return PyErr_NoMemory();
    }
    d->nodeid = nodeid;
    d->doc_path = doc;
    d->doc = v;
    pthread_mutex_lock(&f->lock);
    struct dir *old = dir_by_node(f, nodeid);
    if (old)
        drop_dir(f, old);
    else if (f->dirs.count >= DIRS_MAX) {
        for (size_t i = 0; i < f->dirs.size; i++)
            while (f->dirs.buckets[i])
                drop_dir(f, f->dirs.buckets[i]);
    }
    table_put(&f->dirs, d, dir_key);
    pthread_mutex_unlock(&f->lock);
    Py_RETURN_NONE;
}

static PyObject *Front_keep(Front *f, PyObject *args)
{
    unsigned long long id;
    int fd;
    PyObject *path, *version;
    version_t v;
    if (!PyArg_ParseTuple(args, "KiO!O!", &id, &fd, &PyBytes_Type, &path, &PyTuple_Type, &version)
        || parse_version(version, &v) < 0)
        return NULL;
    pthread_mutex_lock(&f->lock);
    struct kept *k = kept_by_id(f, id);
    int known = k != NULL, usable = k && !k->dropped, refused = !k && f->open_fds >= f->kept_max;
    pthread_mutex_unlock(&f->lock);
    if (known || refused) {
        close(fd);
        return PyBool_FromLong(usable);
    }
    k = calloc(1, sizeof(*k));
    char *p = strdup(PyBytes_AS_STRING(path));
    if (!k || !p) {
        free(k);
        free(p);
        close(fd);
        Py_RETURN_FALSE;
    }
    *k = (struct kept){.id = id, .fd = fd, .path = p, .v = v, .shown_at = monotonic()};
    pthread_mutex_lock(&f->lock);
    table_put(&f->kept, k, kept_key);
    f->open_fds++;
    pthread_mutex_unlock(&f->lock);
    Py_RETURN_TRUE;
}

static PyObject *Front_fill(Front *f, PyObject *args)
{
    unsigned long long parent, kid, slot, mode, uid, gid;
    long long mtime, position = -1;
    PyObject *names, *nodeids, *offsets, *lengths;
    if (!PyArg_ParseTuple(args, "KKKO!O!O!O!LKKK|L", &parent, &kid, &slot, &PyList_Type, &names,
                          &PyList_Type, &nodeids, &PyList_Type, &offsets, &PyList_Type, &lengths,
                          &mtime, &mode, &uid, &gid, &position))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    if (PyList_GET_SIZE(nodeids) != n || PyList_GET_SIZE(offsets) != n
        || PyList_GET_SIZE(lengths) != n) {
        PyErr_SetString(PyExc_ValueError, "rows of different lengths");
        return NULL;
    }
    /* Made outside the lock, then linked in under it. */
    struct row **rows = calloc(n ? n : 1, sizeof(*rows));
    if (!rows)
        return PyErr_NoMemory();
    Py_ssize_t made = 0;
    for (; made < n; made++) {
        PyObject *name = PyList_GET_ITEM(names, made);
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) > 1024) {
            PyErr_SetString(PyExc_ValueError, "a name is not bytes, or too long");
            goto fail;
        }
        size_t len = PyBytes_GET_SIZE(name);
        struct row *r = calloc(1, sizeof(*r) + len);
        if (!r) {
            PyErr_NoMemory();
            goto fail;
        }
        rows[made] = r;
        r->parent = parent;
        r->nodeid = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(nodeids, made));
        r->offset = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(offsets, made));
        r->length = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(lengths, made));
        if (PyErr_Occurred())
            goto fail;
        r->mtime_ns = mtime;
        r->mode = mode;
        r->uid = uid;
        r->gid = gid;
        r->namelen = len;
        memcpy(r->name, PyBytes_AS_STRING(name), len);
        r->name_hash = name_hash(parent, r->name, len);
    }
    pthread_mutex_lock(&f->lock);
    struct dir *d = dir_by_node(f, parent); /* none: rows a listing sent, for reads only */
    struct kept *k = kept_by_id(f, kid);
    struct slot *s = slot_by_number(f, slot);
    Py_ssize_t added = 0;
    if (k && !k->dropped && (size_t)n <= f->rows_max) {
        if (!s && (s = calloc(1, sizeof(*s)))) {
            s->slot = slot;
            table_put(&f->slots, s, slot_key);
        }
        if (f->rows + n > f->rows_max)
            make_room(f, s, n); /* (may drop listings: the one below is found after) */
        /* the listing these rows are at `position` of, if they are a listing's */
        struct listing *l = position >= 0 ? listing_by_node(f, parent) : NULL;
        if (l && ((uint64_t)position < l->first || (uint64_t)(position + n) > l->total))
            l = NULL;
        if (l && s && list_slot(l, s) < 0)
            l = NULL;
        for (Py_ssize_t i = 0; s && i < n; i++) {
            struct row *r = rows[i], *have = row_by_node(f, r->nodeid);
            if (l)
                l->at[position + i - l->first] = have ? have : r;
            if (have) { /* filled before: the same version's row, named here now if it was not */
                if (d && !have->in_names && have->parent == parent)
                    name_row(f, d, have);
                continue;
            }
            r->kept = k;
            r->slot = s;
            k->rows++;
            r->next_in_slot = s->rows;
            s->rows = r;
            table_put(&f->nodes, r, node_key);
            if (d)
                name_row(f, d, r);
            rows[i] = NULL;
            added++;
        }
        f->rows += added;
    }
    pthread_mutex_unlock(&f->lock);
    for (Py_ssize_t i = 0; i < n; i++)
        free(rows[i]);
    free(rows);
    return PyLong_FromSsize_t(added);
fail:
    for (Py_ssize_t i = 0; i < n; i++)
        free(rows[i]);
    free(rows);
    return NULL;
}

/* The files and directories a listing made ahead was made from: a list of (path, version
   or None, whether a directory), or None (a listing Python's reply started). 0, or -1
   with an exception set. */
static int parse_deps(PyObject *list, struct dep **deps, size_t *n)
{
    *deps = NULL;
    *n = 0;
    if (list == Py_None)
        return 0;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "made_from: a list or None");
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(list);
    *deps = calloc(count ? count : 1, sizeof(**deps));
    if (!*deps) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++, (*n)++) {
        PyObject *path, *version;
        struct dep *d = &(*deps)[i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "O!Op", &PyBytes_Type, &path, &version,
                              &d->dir))
            goto fail;
        d->absent = version == Py_None;
        if (!d->absent && (!PyTuple_Check(version) || parse_version(version, &d->v) < 0)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a version: a tuple or None");
            goto fail;
        }
        if (!(d->path = strdup(PyBytes_AS_STRING(path)))) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    return 0;
fail:
    free_deps(*deps, *n);
    *deps = NULL;
    return -1;
}

static PyObject *Front_listing(Front *f, PyObject *args)
{
    unsigned long long nodeid, total, first;
    PyObject *made_from = Py_None;
    if (!PyArg_ParseTuple(args, "KKK|O", &nodeid, &total, &first, &made_from))
        return NULL;
    struct dep *deps;
    size_t ndeps;
    if (parse_deps(made_from, &deps, &ndeps) < 0)
        return NULL;
    struct listing *l = NULL;
    struct row **at = NULL;
    if (first <= total && total - first <= POSITIONS_MAX
        && (at = calloc(total - first ? total - first : 1, sizeof(*at)))
        && (l = malloc(sizeof(*l))))
        *l = (struct listing){.nodeid = nodeid, .total = total, .first = first, .at = at,
                              .ahead = made_from != Py_None, .ndeps = ndeps, .deps = deps};
    else {
        free(at);
        free_deps(deps, ndeps);
    }
    pthread_mutex_lock(&f->lock);
    struct listing *old = listing_by_node(f, nodeid);
    if (old)
        drop_listing(f, old);
    if (l && (f->listings.count >= LISTINGS_MAX || f->positions + (total - first) > POSITIONS_MAX))
        drop_all_listings(f);
    if (l) {
        table_put(&f->listings, l, listing_key);
        f->positions += total - first;
    }
    pthread_mutex_unlock(&f->lock);
    return PyBool_FromLong(l != NULL);
}

static PyObject *Front_unlist(Front *f, PyObject *arg)
{
    unsigned long long nodeid = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&f->lock);
    struct listing *l = listing_by_node(f, nodeid);
    if (l)
        drop_listing(f, l);
    pthread_mutex_unlock(&f->lock);
    Py_RETURN_NONE;
}

static PyObject *Front_retire(Front *f, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    uint64_t refs = 0;
    struct row *rows = NULL;
    pthread_mutex_lock(&f->lock);
    struct slot *s = slot_by_number(f, n);
    if (s && s->refs) {
        refs = s->refs; /* taken over by Python: the slot stays */
        s->refs = 0;
    } else if (s) {
        rows = unlink_rows(f, s);
        table_remove(&f->slots, s, slot_key);
        free(s);
    }
    pthread_mutex_unlock(&f->lock);
    free_rows(rows); /* outside the lock */
    return PyLong_FromUnsignedLongLong(refs);
}

static PyObject *Front_shown_at(Front *f, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&f->lock);
    struct kept *k = kept_by_id(f, id);
    double at = k && !k->dropped ? k->shown_at : 0.0;
    pthread_mutex_unlock(&f->lock);
    return PyFloat_FromDouble(at);
}

static PyObject *Front_drop(Front *f, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    int fd = -1;
    pthread_mutex_lock(&f->lock);
    struct kept *k = kept_by_id(f, id);
    if (k && !k->dropped) {
        k->dropped = 1;
        if (!k->busy) { /* else the last worker reading it closes it */
            fd = k->fd;
            k->fd = -1;
            f->open_fds--;
        }
        k->rows++; /* released right below: freed if no row names it */
        release_kept(f, k);
    }
    pthread_mutex_unlock(&f->lock);
    if (fd >= 0)
        close(fd); /* outside the lock: closing a removed file's last descriptor frees it */
    Py_RETURN_NONE;
}

static PyObject *Front_stats(Front *f, PyObject *unused)
{
    PyObject *answered = PyDict_New(), *forwarded = PyDict_New(), *misses = PyDict_New();
    PyObject *result = NULL;
    if (!answered || !forwarded || !misses)
        goto done;
    pthread_mutex_lock(&f->lock);
    uint64_t answered_n[KINDS], passed_n[OPCODES], miss[MISSES];
    memcpy(answered_n, f->answered, sizeof(answered_n));
    memcpy(passed_n, f->passed, sizeof(passed_n));
    memcpy(miss, f->misses, sizeof(miss));
    uint64_t rows = f->rows, kept = f->open_fds, dirs = f->dirs.count, slots = f->slots.count;
    uint64_t listings = f->listings.count;
    uint64_t disk = f->disk_reads;
    pthread_mutex_unlock(&f->lock);
    for (int i = 0; i < KINDS - 1; i++) {
        PyObject *a = PyLong_FromUnsignedLongLong(answered_n[i]);
        int bad = !a || PyDict_SetItemString(answered, kind_names[i], a);
        Py_XDECREF(a);
        if (bad)
            goto done;
    }
    for (int op = 0; op < OPCODES; op++) {
        if (!passed_n[op])
            continue;
        char number[16];
        const char *name = opcode_name(op);
        if (!name) {
            snprintf(number, sizeof(number), "opcode %d", op);
            name = number;
        }
        PyObject *b = PyLong_FromUnsignedLongLong(passed_n[op]);
        int bad = !b || PyDict_SetItemString(forwarded, name, b);
        Py_XDECREF(b);
        if (bad)
            goto done;
    }
    for (int i = 0; i < MISSES; i++) {
        PyObject *m = PyLong_FromUnsignedLongLong(miss[i]);
        int bad = !m || PyDict_SetItemString(misses, miss_names[i], m);
        Py_XDECREF(m);
        if (bad)
            goto done;
    }
    result = Py_BuildValue("{sOsOsKsOsKsKsKsKsK}", "answered", answered, "passed on", forwarded,
                           "read from disk", (unsigned long long)disk,
                           "misses", misses, "rows", (unsigned long long)rows, "versions",
                           (unsigned long long)kept, "directories", (unsigned long long)dirs,
                           "slots", (unsigned long long)slots, "listings",
                           (unsigned long long)listings);
done:
    Py_XDECREF(answered);
    Py_XDECREF(forwarded);
    Py_XDECREF(misses);
    return result;
}

static PyObject *Front_channel(Front *f, void *unused) { return PyLong_FromLong(f->theirs); }

static PyMethodDef Front_methods[] = {
    {"start", (PyCFunction)Front_start, METH_NOARGS, "Start the thread that reads the device."},
    {"stop", (PyCFunction)Front_stop, METH_NOARGS,
     "Wait up to 5 s for the thread to end (after the unmount): whether it did."},
    {"directory", (PyCFunction)Front_directory, METH_VARARGS,
     "directory(nodeid, doc_path, doc_version): a prepared directory, its array's document "
     "at that version; its rows named before are dropped."},
    {"keep", (PyCFunction)Front_keep, METH_VARARGS,
     "keep(id, fd, path, version) -> bool: a version Python keeps, read through fd, which "
     "the front owns from then on (closed at once if refused)."},
    {"fill", (PyCFunction)Front_fill, METH_VARARGS,
     "fill(parent, kept_id, slot, names, nodeids, offsets, lengths, mtime_ns, mode, uid, gid"
     "[, position]) -> rows added; named for lookups in parent if it is a prepared directory, "
     "else for reads by node id only; at `position` on of parent's listing if given."},
    {"listing", (PyCFunction)Front_listing, METH_VARARGS,
     "listing(nodeid, total, first[, made_from]) -> bool: Python took a listing of directory "
     "nodeid, `total` positions, its chunk files from `first` on (their rows come with "
     "`fill`'s position); the one before is dropped. Made ahead of the kernel's read if "
     "made_from, what it was made from [(path, version or None, is a directory)], is given: answered "
     "from 0 too while they hold. False: refused (too big), Python answers it."},
    {"unlist", (PyCFunction)Front_unlist, METH_O, "unlist(nodeid): Python dropped its listing."},
    {"retire", (PyCFunction)Front_retire, METH_O,
     "retire(slot) -> references counted here: taken over (the slot stays) if any, else "
     "the slot's rows are dropped and 0 returned."},
    {"shown_at", (PyCFunction)Front_shown_at, METH_O,
     "shown_at(id) -> when a lookup here last showed the version (time.monotonic), or 0."},
    {"drop", (PyCFunction)Front_drop, METH_O, "drop(id): the version is no longer kept."},
    {"stats", (PyCFunction)Front_stats, METH_NOARGS, "Requests answered and forwarded, misses, sizes."},
    {NULL},
};

static PyGetSetDef Front_getset[] = {
    {"channel", (getter)Front_channel, NULL, "pyfuse3's end of the channel", NULL},
    {NULL},
};

static PyTypeObject FrontType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs.fuse.kernel_served._front.Front",
    .tp_basicsize = sizeof(Front),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native front of a kernel-served mount (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Front_init,
    .tp_dealloc = (destructor)Front_dealloc,
    .tp_methods = Front_methods,
    .tp_getset = Front_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_front", "The native front of kernel-served mounts.", -1, NULL,
};

PyMODINIT_FUNC PyInit__front(void)
{
    if (PyType_Ready(&FrontType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&FrontType);
    if (PyModule_AddObject(m, "Front", (PyObject *)&FrontType) < 0) {
        Py_DECREF(&FrontType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "ROWS_MAX", ROWS_MAX);
    return m;
}

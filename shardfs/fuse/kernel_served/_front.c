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
 * are counted here alone: lookups and listings answered here count here, and Python
 * counts those it answers here too (`ref`). FORGET goes to Python, which subtracts here
 * (`unref`); at zero the slot and its rows are dropped in the same step, under the
 * tables' lock, and only then does Python let the slot go: so no node id of a slot let go
 * is ever handed out here.
 *
 * Rows are held in groups, one per (slot, directory), dropped least recently used first
 * when the rows would pass their bound; every step under the tables' lock costs O(rows
 * freed + 1), amortised (the hash tables are sized at start, every list is doubly linked).
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
#include <signal.h>
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
/* Slots at most: Python's (VERSIONED_SLOTS in shardfs/fuse/inodes.py), since a slot is
   here only while Python holds it (it lets one go only after `unref` dropped it here). */
#define SLOTS_MAX (1 << 20)
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
    /* aligned as the header `forward` reads it through (after `advise`, it would not be) */
    _Alignas(struct fuse_in_header) char request[];
};

/* A prepared directory (by node id) and the version of its array's document. */
/* A doubly linked list of groups, each holding its place in it at the same offset. */
struct list {
    struct group *first, *last;
};
struct place {
    struct group *prev, *next;
};

struct dir {
    struct dir *next;
    uint64_t nodeid;
    char *doc_path;
    version_t doc;
    struct list groups; /* those with rows named here (in_dir) */
};

/* A slot (one version of an array's chunks stored in one shard), by Python's number: the
   kernel's references to its node ids, counted here alone (Python asks: `ref`, `unref`),
   and its groups of rows. */
struct slot {
    struct slot *next;
    uint64_t slot;
    uint64_t refs;
    struct list groups; /* in_slot */
};

/* The rows of one slot in one directory (by node id), Python's unit of filling and the
   front's unit of dropping, least recently used first. */
struct group {
    struct group *next; /* in the groups table */
    struct place use;   /* in the front's use order, the least recently used first */
    struct place in_slot;
    struct place in_dir; /* in `dir`'s, while rows of it are named there */
    struct slot *slot;
    struct dir *dir;
    struct listing *listing; /* the listing of `parent` holding rows of it, if any */
    uint64_t parent, nrows;
    struct row *rows; /* next_in_group */
};

/* A listing Python took of a directory (by node id), from the position where its chunk
   files are: the rows at each position, where Python made them ready (NULL elsewhere:
   Python answers from there), and the groups of those rows (each of `nodeid`, each
   pointing back here: the listing is dropped before a group's rows are freed). */
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
    struct group **groups;
    size_t ngroups, groups_size;
};

struct row {
    struct row *next_name, *next_node, *next_in_group;
    uint64_t parent, nodeid, name_hash;
    struct kept *kept;
    struct group *group;
    uint64_t offset, length;
    int64_t mtime_ns;
    uint32_t mode, uid, gid;
    int in_names;
    uint16_t namelen;
    char name[];
};

/* Chained hash tables keyed by 64-bit numbers; each holds its items' `next` link at the
   offset given. Their buckets are sized at start for the most items they may hold (a
   few per bucket at most), so no call under the tables' lock ever rehashes one. */
typedef struct {
    void **buckets;
    size_t size, count, link;
} table_t;

static void **link_of(table_t *t, void *item) { return (void **)((char *)item + t->link); }

/* The buckets for `n` items at most: a power of two, at least 16, at most `most`. */
static size_t buckets_for(size_t n, size_t most)
{
    size_t size = 16;
    while (size < n && size < most)
        size *= 2;
    return size;
}

/* A table of `size` buckets (a power of two). */
static int table_init(table_t *t, size_t link, size_t size)
{
    t->size = size;
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

static void table_put(table_t *t, void *item, key_fn key)
{
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
/* Why a lookup or read went to Python (docs/semantics.md, "Statistics"); "short read": fewer
   bytes than asked came back without waiting (the rest is not in the page cache, or the file
   shrank), "error": the read itself failed. */
enum { M_NO_ROW, M_CHANGED, M_NOT_CACHED, M_SHORT, M_DROPPED, M_ERROR, MISSES };
static const char *miss_names[MISSES] = {
    "no row", "changed", "not cached", "short read", "dropped", "error"};

typedef struct {
    PyObject_HEAD
    int dev;     /* our own duplicate of the session's /dev/fuse descriptor */
    int ours;    /* the front's end of the channel */
    int theirs;  /* pyfuse3's end */
    pthread_t thread;
    int started, running;
    pthread_mutex_t lock;
    table_t kept, dirs, slots, groups, nodes, names, listings;
    struct list use; /* groups in the order of their use */
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
    int leaving; /* `stop` was called: the thread ends at its next EINTR */
    pthread_cond_t work;
    struct job *jobs, *last_job;
    size_t queued;
    char *request, *reply; /* malloc's: aligned as the structures read and written there */
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

/* The slot numbered `n`, made if it is not here (`fresh`, made outside the lock, is then
   taken: set to NULL), or NULL if it is not and none can be made. */
static struct slot *slot_made(Front *f, uint64_t n, struct slot **fresh)
{
    struct slot *s = slot_by_number(f, n);
    if (!s && *fresh) {
        s = *fresh;
        *fresh = NULL;
        *s = (struct slot){.slot = n};
        table_put(&f->slots, s, slot_key);
    }
    return s;
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
    for (size_t i = 0; i < l->ngroups; i++)
        l->groups[i]->listing = NULL;
    free_deps(l->deps, l->ndeps);
    table_remove(&f->listings, l, listing_key);
    f->positions -= l->total - l->first;
    free(l->groups);
    free(l->at);
    free(l);
}

static void drop_all_listings(Front *f)
{
    for (size_t i = 0; i < f->listings.size; i++)
        while (f->listings.buckets[i])
            drop_listing(f, f->listings.buckets[i]);
}

/* Count `g` as held by `l` (a listing of its directory): 0, or -1 if out of memory (then
   its rows are not listed). */
static int list_group(struct listing *l, struct group *g)
{
    if (g->listing == l)
        return 0;
    if (l->ngroups == l->groups_size) {
        size_t size = l->groups_size ? l->groups_size * 2 : 4;
        struct group **groups = realloc(l->groups, size * sizeof(*groups));
        if (!groups)
            return -1;
        l->groups = groups;
        l->groups_size = size;
    }
    l->groups[l->ngroups++] = g;
    g->listing = l;
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

#define USE offsetof(struct group, use)
#define IN_SLOT offsetof(struct group, in_slot)
#define IN_DIR offsetof(struct group, in_dir)

static struct place *place(struct group *g, size_t at) { return (struct place *)((char *)g + at); }

/* Put `g` last in `l` (its place at offset `at`). */
static void list_append(struct list *l, struct group *g, size_t at)
{
    *place(g, at) = (struct place){.prev = l->last};
    if (l->last)
        place(l->last, at)->next = g;
    else
        l->first = g;
    l->last = g;
}

static void list_remove(struct list *l, struct group *g, size_t at)
{
    struct place *p = place(g, at);
    if (p->prev)
        place(p->prev, at)->next = p->next;
    else
        l->first = p->next;
    if (p->next)
        place(p->next, at)->prev = p->prev;
    else
        l->last = p->prev;
}

static void dir_unlink(struct group *g)
{
    if (g->dir)
        list_remove(&g->dir->groups, g, IN_DIR);
    g->dir = NULL;
}

/* Answer lookups of `r`'s name in `d` (its directory) with `r`, in place of the row
   that name had (which stays for reads by node id). */
static void name_row(Front *f, struct dir *d, struct row *r)
{
    struct row *old = row_by_name(f, d->nodeid, r->name, r->namelen);
    if (old)
        unname(f, old);
    if (r->group->dir != d) {
        r->group->dir = d;
        list_append(&d->groups, r->group, IN_DIR);
    }
    table_put(&f->names, r, name_key);
    r->in_names = 1;
}

static void drop_dir(Front *f, struct dir *d)
{
    while (d->groups.first) {
        struct group *g = d->groups.first;
        for (struct row *r = g->rows; r; r = r->next_in_group)
            unname(f, r);
        dir_unlink(g);
    }
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

/* -- groups: the unit rows are filled and dropped in ----------------------------------- */

static uint64_t group_hash(uint64_t slot, uint64_t parent)
{
    return slot * 0x9e3779b97f4a7c15ULL ^ parent;
}

static uint64_t group_key(void *p)
{
    struct group *g = p;
    return group_hash(g->slot->slot, g->parent);
}

static struct group *group_of(Front *f, uint64_t slot, uint64_t parent)
{
    for (struct group *g = table_first(&f->groups, group_hash(slot, parent)); g; g = g->next)
        if (g->slot->slot == slot && g->parent == parent)
            return g;
    return NULL;
}

/* `g` was used: it is dropped last. */
static void touch(Front *f, struct group *g)
{
    if (f->use.last == g)
        return;
    list_remove(&f->use, g, USE);
    list_append(&f->use, g, USE);
}

/* A new, empty group of rows of `s` in directory `parent`, the newest. */
static void group_link(Front *f, struct group *g, struct slot *s, uint64_t parent)
{
    *g = (struct group){.slot = s, .parent = parent};
    list_append(&s->groups, g, IN_SLOT);
    table_put(&f->groups, g, group_key);
    list_append(&f->use, g, USE);
}

/* Take group `g` and its rows out of every table (the listing holding any dropped
   first); its rows are chained onto `*garbage` (by next_in_group), the group itself
   too (as the chain's first item's `group`, see `free_garbage`). O(its rows + 1). */
static void group_unlink(Front *f, struct group *g, struct row **garbage, struct group **spent)
{
    if (g->listing)
        drop_listing(f, g->listing);
    dir_unlink(g);
    struct row *r = g->rows, *last = NULL;
    for (; r; last = r, r = r->next_in_group) {
        unname(f, r);
        table_remove(&f->nodes, r, node_key);
        release_kept(f, r->kept);
    }
    f->rows -= g->nrows;
    if (last) {
        last->next_in_group = *garbage;
        *garbage = g->rows;
    }
    table_remove(&f->groups, g, group_key);
    list_remove(&f->use, g, USE);
    list_remove(&g->slot->groups, g, IN_SLOT);
    g->next = *spent; /* (out of the table: its link is free) */
    *spent = g;
}

/* Free what `group_unlink` took out: outside the tables' lock. */
static void free_garbage(struct row *rows, struct group *groups)
{
    while (rows) {
        struct row *next = rows->next_in_group;
        free(rows);
        rows = next;
    }
    while (groups) {
        struct group *next = groups->next;
        free(groups);
        groups = next;
    }
}

/* Room for `n` rows more: if they would pass `rows_max`, the least recently used groups
   other than `keep` are dropped until at most three quarters of it would be held (the
   kernel's references stay counted in their slots). O(rows dropped + groups dropped). */
static void make_room(Front *f, struct group *keep, size_t n, struct row **garbage,
                      struct group **spent)
{
    if (f->rows + n <= f->rows_max)
        return;
    while (f->rows + n > f->rows_max / 4 * 3) {
        struct group *g = f->use.first;
        if (g == keep) /* (the last: it was used just now) */
            g = g->use.next;
        if (!g)
            return;
        group_unlink(f, g, garbage, spent);
    }
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
    r->group->slot->refs++; /* before the reply: the kernel holds it from then on */
    touch(f, r->group);
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
    touch(f, r->group);
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
            f->misses[got >= 0 ? M_SHORT : errno == EAGAIN ? M_NOT_CACHED : M_ERROR]++;
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
    touch(f, r->group);
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
        r->group->slot->refs++; /* before the reply: the kernel holds it from then on */
        touch(f, r->group);
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
   is gone. `buf` is aligned as a `struct fuse_in_header` (malloc's, or a job's). */
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
            if (errno == EINTR && __atomic_load_n(&f->leaving, __ATOMIC_ACQUIRE))
                break; /* `stop`: requests still on their way are left to the unmount's end */
            if (errno == EINTR || errno == EAGAIN || errno == ENOENT)
                continue; /* ENOENT: a request interrupted before it was read */
            break;        /* ENODEV: unmounted */
        }
        if (n == 0)
            break; /* the end of a socket standing in for the device (tests); never /dev/fuse's */
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
        table_free(&f->groups, free);
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
    /* Buckets for a few items each at the most (kept versions: `kept_max` with descriptors,
       and those dropped that rows still name; slots: 16 at Python's most, a few thousand in
       use mostly), so that the tables' buckets cost 1.6 MiB in all, not the 6.5 of one each:
       they are all written to in a walk of a hundred thousand files. */
    if (table_init(&f->kept, offsetof(struct kept, next), buckets_for(kept_max, 1 << 16))
        || table_init(&f->dirs, offsetof(struct dir, next), DIRS_MAX)
        || table_init(&f->slots, offsetof(struct slot, next), SLOTS_MAX / 16)
        || table_init(&f->groups, offsetof(struct group, next), buckets_for(rows_max / 16, ROWS_MAX))
        || table_init(&f->nodes, offsetof(struct row, next_node), buckets_for(rows_max / 4, ROWS_MAX))
        || table_init(&f->names, offsetof(struct row, next_name), buckets_for(rows_max / 4, ROWS_MAX))
        || table_init(&f->listings, offsetof(struct listing, next), LISTINGS_MAX)
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

/* The signal `stop` interrupts the thread's read of the device with; its handler does
   nothing (installed without SA_RESTART, so that the read fails with EINTR). */
#define WAKE (SIGRTMIN + 4)

static void woken(int sig) { (void)sig; }

static PyObject *Front_start(Front *f, PyObject *Py_UNUSED(unused))
{
    if (f->started) {
        PyErr_SetString(PyExc_RuntimeError, "the front is started already");
        return NULL;
    }
    struct sigaction wake = {.sa_handler = woken};
    if (sigaction(WAKE, &wake, NULL) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
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

static PyObject *Front_stop(Front *f, PyObject *Py_UNUSED(unused))
{
    /* After the unmount, when pyfuse3 reads the channel no more. The thread's read of
       the device then fails (ENODEV), unless requests it passed on are still unanswered
       (readers busy at the unmount): those keep the connection, and the read waits. So
       its read is interrupted (WAKE, until it ends: a signal sent just before the read
       would be lost), and a send waiting for room in the channel fails. The requests
       left go with the connection when the process ends. */
    if (f->started) {
        __atomic_store_n(&f->leaving, 1, __ATOMIC_RELEASE);
        shutdown(f->ours, SHUT_WR);
        int e = ETIMEDOUT;
        Py_BEGIN_ALLOW_THREADS
        for (int tries = 0; e == ETIMEDOUT && tries < 50; tries++) {
            pthread_kill(f->thread, WAKE);
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            e = pthread_timedjoin_np(f->thread, NULL, &until);
        }
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
    if ((size_t)n > f->rows_max) /* cut: no more can be held (Python answers the rest) */
        n = (Py_ssize_t)f->rows_max;
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
    struct slot *fresh_slot = malloc(sizeof(struct slot));
    struct group *fresh_group = malloc(sizeof(struct group)), *spent = NULL;
    struct row *garbage = NULL;
    Py_ssize_t added = 0;
    pthread_mutex_lock(&f->lock);
    struct dir *d = dir_by_node(f, parent); /* none: rows a listing sent, for reads only */
    struct kept *k = kept_by_id(f, kid);
    struct slot *s = slot_made(f, slot, &fresh_slot);
    struct group *g = s ? group_of(f, slot, parent) : NULL;
    if (s && !g && fresh_group) {
        group_link(f, g = fresh_group, s, parent);
        fresh_group = NULL;
    }
    if (g && k && !k->dropped) {
        touch(f, g);
        /* the rows not held yet, those the room is made for: counted only where all of
           them would not fit */
        size_t fresh = n;
        if (f->rows + n > f->rows_max)
            for (Py_ssize_t i = 0; i < n; i++)
                fresh -= row_by_node(f, rows[i]->nodeid) != NULL;
        make_room(f, g, fresh, &garbage, &spent); /* (may drop listings: found after) */
        /* the listing these rows are at `position` of, if they are a listing's */
        struct listing *l = position >= 0 ? listing_by_node(f, parent) : NULL;
        if (l && ((uint64_t)position < l->first || (uint64_t)(position + n) > l->total))
            l = NULL;
        if (l && list_group(l, g) < 0)
            l = NULL;
        /* Beyond `rows_max` the fill is cut: Python answers for the rest. */
        for (Py_ssize_t i = 0; i < n && f->rows < f->rows_max; i++) {
            struct row *r = rows[i], *have = row_by_node(f, r->nodeid);
            if (have) { /* filled before: the same version's row, named here now if it was not */
                if (have->group != g)
                    continue; /* (of another directory node: not this listing's) */
                if (l)
                    l->at[position + i - l->first] = have;
                if (d && !have->in_names)
                    name_row(f, d, have);
                continue;
            }
            if (l)
                l->at[position + i - l->first] = r;
            r->kept = k;
            r->group = g;
            k->rows++;
            r->next_in_group = g->rows;
            g->rows = r;
            g->nrows++;
            f->rows++;
            table_put(&f->nodes, r, node_key);
            if (d)
                name_row(f, d, r);
            rows[i] = NULL;
            added++;
        }
    }
    if (g && !g->nrows) /* nothing of it held (its kept version dropped, or no room) */
        group_unlink(f, g, &garbage, &spent);
    pthread_mutex_unlock(&f->lock);
    free_garbage(garbage, spent);
    free(fresh_slot);
    free(fresh_group);
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

static PyObject *Front_ref(Front *f, PyObject *args)
{
    unsigned long long n, count;
    if (!PyArg_ParseTuple(args, "KK", &n, &count))
        return NULL;
    struct slot *fresh = malloc(sizeof(*fresh));
    pthread_mutex_lock(&f->lock);
    struct slot *s = slot_made(f, n, &fresh);
    if (s)
        s->refs += count;
    pthread_mutex_unlock(&f->lock);
    free(fresh);
    if (!s)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Front_unref(Front *f, PyObject *args)
{
    unsigned long long n, count;
    if (!PyArg_ParseTuple(args, "KK", &n, &count))
        return NULL;
    uint64_t left = 0;
    struct row *garbage = NULL;
    struct group *spent = NULL;
    pthread_mutex_lock(&f->lock);
    struct slot *s = slot_by_number(f, n);
    if (s) {
        s->refs -= count < s->refs ? count : s->refs;
        left = s->refs;
        if (!left) { /* let go: no lookup here can hand out its node ids from now on */
            while (s->groups.first)
                group_unlink(f, s->groups.first, &garbage, &spent);
            table_remove(&f->slots, s, slot_key);
            free(s);
        }
    }
    pthread_mutex_unlock(&f->lock);
    free_garbage(garbage, spent); /* outside the lock */
    return PyLong_FromUnsignedLongLong(left);
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

static PyObject *Front_stats(Front *f, PyObject *Py_UNUSED(unused))
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
    uint64_t listings = f->listings.count, groups = f->groups.count;
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
        char number[24]; /* "opcode " and any int, as the compiler cannot tell op < 64 */
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
    result = Py_BuildValue("{sOsOsKsOsKsKsKsKsKsK}", "answered", answered, "passed on", forwarded,
                           "read from disk", (unsigned long long)disk,
                           "misses", misses, "rows", (unsigned long long)rows, "versions",
                           (unsigned long long)kept, "directories", (unsigned long long)dirs,
                           "slots", (unsigned long long)slots, "listings",
                           (unsigned long long)listings, "groups", (unsigned long long)groups);
done:
    Py_XDECREF(answered);
    Py_XDECREF(forwarded);
    Py_XDECREF(misses);
    return result;
}

static PyObject *Front_channel(Front *f, void *Py_UNUSED(unused)) { return PyLong_FromLong(f->theirs); }

static PyMethodDef Front_methods[] = {
    {"start", (PyCFunction)Front_start, METH_NOARGS, "Start the thread that reads the device."},
    {"stop", (PyCFunction)Front_stop, METH_NOARGS,
     "After the unmount: end the thread (its read of the device interrupted) within 5 s: "
     "whether it ended."},
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
    {"ref", (PyCFunction)Front_ref, METH_VARARGS,
     "ref(slot, count): the kernel took `count` references to node ids of `slot` that "
     "Python gave it (counted here alone; MemoryError: not counted)."},
    {"unref", (PyCFunction)Front_unref, METH_VARARGS,
     "unref(slot, count) -> the kernel's references left: `count` fewer (it forgot them); at "
     "0 the slot and its rows are dropped in the same step, and Python lets it go."},
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
    PyModuleDef_HEAD_INIT,
    .m_name = "_front",
    .m_doc = "The native front of kernel-served mounts.",
    .m_size = -1,
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
    PyModule_AddIntConstant(m, "SLOTS_MAX", SLOTS_MAX);
    return m;
}

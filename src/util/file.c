#define _DEFAULT_SOURCE /* fdopen */
#include "util/file.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

int keel_open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    if (fd < 0) return keel_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return keel_fail("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return keel_fail("%s: %s", path,
                         S_ISFIFO(st.st_mode)  ? "a FIFO, not a regular file"
                         : S_ISDIR(st.st_mode) ? "a folder, not a file"
                                               : "not a regular file");
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

char *keel_read_file(const char *path, size_t *n) {
    int fd = keel_open_regular(path);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd), keel_fail("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *s = len >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)len + 1) : NULL;
    if (!s || fread(s, 1, (size_t)len, f) != (size_t)len) {
        free(s);
        fclose(f);
        keel_fail("%s: cannot read", path);
        return NULL;
    }
    s[len] = 0;
    fclose(f);
    if (n) *n = (size_t)len;
    return s;
}

cJSON *keel_read_json(const char *path) {
    char *s = keel_read_file(path, NULL);
    if (!s) return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(s, &end, 0);
    if (!j) keel_fail("%s: invalid JSON near byte %ld", path, end ? (long)(end - s) : -1L);
    free(s);
    return j;
}

int keel_copy_file(const char *src, const char *dst) {
    size_t n;
    char *buf = keel_read_file(src, &n);
    if (!buf) return -1;
    FILE *f = fopen(dst, "wb");
    bool ok = f && fwrite(buf, 1, n, f) == n;
    int err = errno;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok, ok = fclose(f) == 0 && ok;
    free(buf);
    return ok ? 0 : keel_fail("%s: cannot write a copy of %s: %s", dst, src, strerror(err ? err : EIO));
}

/* Empties the folder open at dfd (which it closes): entries are looked at without following links
 * (fstatat AT_SYMLINK_NOFOLLOW) and sub-folders opened with O_NOFOLLOW, so no link planted in the
 * tree can redirect the removal elsewhere. */
static int empty_dir_fd(int dfd, const char *path, int depth) {
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return keel_fail("%s: cannot list: %s", path, strerror(errno));
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        struct stat st;
        if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone already */
        if (S_ISDIR(st.st_mode)) {
            if (depth > 64) {
                rc = keel_fail("%s/%s: folders nested too deep to remove", path, n);
                break;
            }
            int sub = openat(dfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
            char sp[4096];
            snprintf(sp, sizeof sp, "%s/%s", path, n);
            rc = sub < 0 ? keel_fail("%s: cannot open: %s", sp, strerror(errno)) : empty_dir_fd(sub, sp, depth + 1);
            if (!rc && unlinkat(dfd, n, AT_REMOVEDIR) != 0 && errno != ENOENT)
                rc = keel_fail("%s: cannot remove: %s", sp, strerror(errno));
        } else if (unlinkat(dfd, n, 0) != 0 && errno != ENOENT) {
            rc = keel_fail("%s/%s: cannot remove: %s", path, n, strerror(errno));
        }
    }
    closedir(d);
    return rc;
}

int keel_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : keel_fail("%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) /* a file, or a link (to anything): remove it, not its target */
        return unlink(path) == 0 || errno == ENOENT ? 0 : keel_fail("%s: cannot remove: %s", path, strerror(errno));
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (dfd < 0) return keel_fail("%s: cannot open: %s", path, strerror(errno));
    if (empty_dir_fd(dfd, path, 0)) return -1;
    return rmdir(path) == 0 || errno == ENOENT ? 0 : keel_fail("%s: cannot remove: %s", path, strerror(errno));
}

int keel_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return keel_fail("%s: cannot open: %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 ? 0 : keel_fail("%s: fsync failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

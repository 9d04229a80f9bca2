/* keel: error reporting. The library never exits; it returns a status and leaves a message here. */
#ifndef KEEL_ERROR_H
#define KEEL_ERROR_H

#include <stdarg.h>

/* Set the calling thread's last error message (printf-style). Always returns -1 so that
 * `return keel_fail(...)` reads naturally in functions that return int status. */
int keel_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The calling thread's last error message ("" when none). */
const char *keel_last_error(void);

#endif

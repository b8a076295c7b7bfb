// Disk space for the parameter server's state or spool dir (state_space.h).
#include "server/state_space.h"

#include <string.h>

#include "base/bytes_text.h"
#include "base/file.h"
#include "base/log.h"

size_t state_space_needed(const StateSpace *s, int kept_now) {
    size_t uploads = (size_t)(s->peers > 0 ? s->peers : 0) * s->upload;
    if (s->aggregate == 0) return uploads;
    // keep_steps kept while the next one is written, before the oldest is removed.
    int more = s->keep_steps + 1 - kept_now;
    if (more < 1) more = 1;
    return uploads + (size_t)more * (s->aggregate + s->beside);
}

void state_space_check(const char *dir, const char *flag, const StateSpace *s, int kept_now) {
    size_t free_b;
    int err = fs_free_bytes(dir, &free_b);
    if (err) {
        log_debug("server: %s %s: free space not checked (%s)", flag, dir, strerror(err));
        return;
    }
    size_t needed = state_space_needed(s, kept_now);
    if (free_b >= needed) return;
    char free_text[24], needed_text[24], upload_text[24], aggregate_text[24];
    bytes_text(free_b, free_text, sizeof free_text);
    bytes_text(needed, needed_text, sizeof needed_text);
    bytes_text(s->upload, upload_text, sizeof upload_text);
    bytes_text(s->aggregate + s->beside, aggregate_text, sizeof aggregate_text);
    if (s->aggregate == 0)
        log_warn("server: %s %s: %s free on its filesystem; a round's %d uploads of up to %s each need %s there: "
                 "uploads will be refused (UNAVAILABLE, peers retry) until space is freed",
                 flag, dir, free_text, s->peers, upload_text, needed_text);
    else
        log_warn("server: %s %s: %s free on its filesystem; a round needs up to %s more there (%d uploads of up to %s "
                 "each, and %d aggregates of %s kept with --keep_steps %d while the next is written, %d there now): "
                 "uploads will be refused (UNAVAILABLE, peers retry) or aggregates wait unwritten until space is freed",
                 flag, dir, free_text, needed_text, s->peers, upload_text, s->keep_steps + 1, aggregate_text,
                 s->keep_steps, kept_now);
}

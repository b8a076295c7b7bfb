// YAML -> YNode tree with libyaml's event parser.
#include "config/yaml_tree.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/alloc.h"
#include "base/error.h"

static YNode *node_new(YNodeKind kind, const char *origin, int line) {
    YNode *n = spes_calloc(1, sizeof(YNode));
    if (!n) return NULL;
    n->kind = kind;
    n->origin = origin;
    n->line = line;
    return n;
}

void ytree_free(YNode *node) {
    if (!node) return;
    for (int i = 0; i < node->n; i++) {
        if (node->keys) free(node->keys[i]);
        ytree_free(node->items[i]);
    }
    free(node->keys);
    free(node->items);
    free(node->value);
    free(node);
}

// Appends item (and key for maps); takes ownership of both, frees them on failure.
static int node_append(YNode *parent, char *key, YNode *item) {
    if (parent->n == parent->cap) {
        int cap = parent->cap ? parent->cap * 2 : 8;
        YNode **items = spes_realloc(parent->items, (size_t)cap * sizeof(YNode *));
        if (!items) goto fail;
        parent->items = items;
        if (parent->kind == YNODE_MAP) {
            char **keys = spes_realloc(parent->keys, (size_t)cap * sizeof(char *));
            if (!keys) goto fail;
            parent->keys = keys;
        }
        parent->cap = cap;
    }
    if (parent->kind == YNODE_MAP) parent->keys[parent->n] = key;
    parent->items[parent->n++] = item;
    return SPES_OK;
fail:
    free(key);
    ytree_free(item);
    return SPES_ERR;
}

typedef struct {
    yaml_parser_t parser;
    const char *origin;
    int line_offset;
} Reader;

static int reader_line(const Reader *r, yaml_mark_t mark) { return r->line_offset + (int)mark.line + 1; }

static int next_event(Reader *r, yaml_event_t *ev) {
    if (!yaml_parser_parse(&r->parser, ev)) {
        const yaml_parser_t *p = &r->parser;
        yaml_mark_t mark = p->problem_mark;
        return spes_fail("%s:%d: YAML syntax error: %s%s%s (column %d)", r->origin, reader_line(r, mark),
                         p->problem ? p->problem : "unknown problem", p->context ? " " : "",
                         p->context ? p->context : "", (int)mark.column + 1);
    }
    return SPES_OK;
}

// Parses the node whose first event is *ev (consumed). Recursion depth is bounded by libyaml
// (it refuses absurd nesting), and we add our own bound for safety.
static int parse_node(Reader *r, yaml_event_t *ev, int depth, YNode **out) {
    *out = NULL;
    int line = reader_line(r, ev->start_mark);
    if (depth > 64) {
        yaml_event_delete(ev);
        return spes_fail("%s:%d: YAML nesting deeper than 64 levels", r->origin, line);
    }
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        yaml_event_delete(ev);
        return spes_fail("%s:%d: YAML aliases (*name) are not supported in configs; write the value out",
                         r->origin, line);
    case YAML_SCALAR_EVENT: {
        YNode *n = node_new(YNODE_SCALAR, r->origin, line);
        if (!n) {
            yaml_event_delete(ev);
            return SPES_ERR;
        }
        n->value = spes_malloc(ev->data.scalar.length + 1);
        if (!n->value) {
            free(n);
            yaml_event_delete(ev);
            return SPES_ERR;
        }
        memcpy(n->value, ev->data.scalar.value, ev->data.scalar.length);
        n->value[ev->data.scalar.length] = '\0';
        if (strlen(n->value) != ev->data.scalar.length) {
            ytree_free(n);
            yaml_event_delete(ev);
            return spes_fail("%s:%d: NUL byte inside a YAML value", r->origin, line);
        }
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        yaml_event_delete(ev);
        *out = n;
        return SPES_OK;
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool is_map = ev->type == YAML_MAPPING_START_EVENT;
        yaml_event_delete(ev);
        YNode *n = node_new(is_map ? YNODE_MAP : YNODE_SEQ, r->origin, line);
        if (!n) return SPES_ERR;
        for (;;) {
            yaml_event_t e;
            if (next_event(r, &e) != SPES_OK) goto fail;
            if (e.type == YAML_SEQUENCE_END_EVENT || e.type == YAML_MAPPING_END_EVENT) {
                yaml_event_delete(&e);
                break;
            }
            char *key = NULL;
            if (is_map) {
                int key_line = reader_line(r, e.start_mark);
                if (e.type != YAML_SCALAR_EVENT) {
                    yaml_event_delete(&e);
                    spes_fail("%s:%d: mapping keys must be plain words", r->origin, key_line);
                    goto fail;
                }
                // Every key is checked against the earlier ones (duplicates are errors): bounded, so
                // that a hostile file of a million keys is refused at once instead of taking hours.
                if (n->n >= YTREE_MAX_MAP_KEYS) {
                    yaml_event_delete(&e);
                    spes_fail("%s:%d: the mapping opened at line %d has more than %d keys; a config has a few "
                              "hundred at most", r->origin, key_line, line, YTREE_MAX_MAP_KEYS);
                    goto fail;
                }
                // YAML 1.1's merge key: PyYAML (OmegaConf, OLMo) merges the mapping it names into
                // this one; read as an ordinary key it would be ignored as unknown, and the run
                // would train without the values it was meant to bring.
                if (e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && strcmp((const char *)e.data.scalar.value, "<<") == 0) {
                    yaml_event_delete(&e);
                    spes_fail("%s:%d: YAML merge keys (<<) are not supported in configs; write the keys out",
                              r->origin, key_line);
                    goto fail;
                }
                key = spes_strdup((const char *)e.data.scalar.value);
                yaml_event_delete(&e);
                if (!key) goto fail;
                if (ytree_map_get(n, key)) {
                    spes_fail("%s:%d: key '%s' appears twice in the same mapping", r->origin, key_line, key);
                    free(key);
                    goto fail;
                }
                if (next_event(r, &e) != SPES_OK) {
                    free(key);
                    goto fail;
                }
            }
            YNode *child;
            if (parse_node(r, &e, depth + 1, &child) != SPES_OK) {
                free(key);
                goto fail;
            }
            if (node_append(n, key, child) != SPES_OK) goto fail;
        }
        *out = n;
        return SPES_OK;
    fail:
        ytree_free(n);
        return SPES_ERR;
    }
    default:
        yaml_event_delete(ev);
        return spes_fail("%s:%d: unexpected YAML event", r->origin, line);
    }
}

int ytree_parse(const char *text, size_t len, const char *origin, int line_offset, YNode **root) {
    *root = NULL;
    Reader r = {.origin = origin, .line_offset = line_offset};
    if (!yaml_parser_initialize(&r.parser)) return spes_fail("%s: cannot initialise the YAML parser", origin);
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)text, len);
    YNode *doc = NULL;
    yaml_event_t ev;
    int rc = SPES_ERR;
    // STREAM-START, then DOCUMENT-START (absent for an empty stream), node, DOCUMENT-END
    if (next_event(&r, &ev) != SPES_OK) goto out;
    yaml_event_delete(&ev);
    if (next_event(&r, &ev) != SPES_OK) goto out;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        doc = node_new(YNODE_MAP, origin, line_offset + 1);
        rc = doc ? SPES_OK : SPES_ERR;
        goto out;
    }
    yaml_event_delete(&ev);
    if (next_event(&r, &ev) != SPES_OK) goto out;
    if (parse_node(&r, &ev, 0, &doc) != SPES_OK) goto out;
    if (next_event(&r, &ev) != SPES_OK) goto out;   // DOCUMENT-END
    yaml_event_delete(&ev);
    if (next_event(&r, &ev) != SPES_OK) goto out;
    if (ev.type != YAML_STREAM_END_EVENT) {
        spes_fail("%s:%d: more than one YAML document; a config is a single document", origin,
                  reader_line(&r, ev.start_mark));
        yaml_event_delete(&ev);
        goto out;
    }
    yaml_event_delete(&ev);
    if (doc->kind == YNODE_SCALAR && ytree_is_null(doc)) {   // "---" alone: empty config
        ytree_free(doc);
        doc = node_new(YNODE_MAP, origin, line_offset + 1);
        if (!doc) goto out;
    }
    rc = SPES_OK;
out:
    yaml_parser_delete(&r.parser);
    if (rc != SPES_OK) {
        ytree_free(doc);
        return SPES_ERR;
    }
    *root = doc;
    return SPES_OK;
}

bool ytree_is_null(const YNode *node) {
    if (!node || node->kind != YNODE_SCALAR || !node->plain) return false;
    const char *v = node->value;
    return v[0] == '\0' || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 ||
           strcmp(v, "NULL") == 0;
}

YNode *ytree_map_get(const YNode *map, const char *key) {
    if (!map || map->kind != YNODE_MAP) return NULL;
    for (int i = 0; i < map->n; i++)
        if (strcmp(map->keys[i], key) == 0) return map->items[i];
    return NULL;
}

// Walks `path` one dotted part at a time; with create, missing maps are added.
static YNode *walk_path(YNode *root, const char *path, bool create, char **last_key, YNode **parent_out) {
    YNode *cur = root;
    const char *p = path;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        char *part = spes_malloc(len + 1);
        if (!part) return NULL;
        memcpy(part, p, len);
        part[len] = '\0';
        if (!dot) {   // last part: hand it back to the caller
            if (last_key) *last_key = part;
            else free(part);
            if (parent_out) *parent_out = cur;
            return cur;
        }
        YNode *next = ytree_map_get(cur, part);
        if (!next && create) {
            // a map only an override brings (line 0): errors about it name the command line
            next = node_new(YNODE_MAP, cur->origin, 0);
            if (!next || node_append(cur, spes_strdup(part), next) != SPES_OK) {
                free(part);
                return NULL;
            }
        } else if (next && create && ytree_is_null(next)) {
            // `section: null` in the file, then an override of section.key: becomes a map
            next->kind = YNODE_MAP;
            free(next->value);
            next->value = NULL;
        }
        free(part);
        if (!next || next->kind != YNODE_MAP) {
            if (create) spes_fail("%s: '%.*s' is not a mapping", path, (int)(p + len - path), path);
            return NULL;
        }
        cur = next;
        p = dot + 1;
    }
}

YNode *ytree_get_path(const YNode *root, const char *path) {
    char *key = NULL;
    YNode *parent = NULL;
    if (!walk_path((YNode *)root, path, false, &key, &parent)) return NULL;
    YNode *n = ytree_map_get(parent, key);
    free(key);
    return n;
}

// parent[key] = value, taking ownership of both. When the old value and the new one are both
// mappings, the new one is merged into the old key by key, as OmegaConf merges an override
// (`--a={x: 1}` changes a.x and keeps a's other keys).
static int put(YNode *parent, char *key, YNode *value) {
    for (int i = 0; i < parent->n; i++) {
        if (strcmp(parent->keys[i], key) != 0) continue;
        free(key);
        YNode *old = parent->items[i];
        if (old->kind != YNODE_MAP || value->kind != YNODE_MAP) {
            ytree_free(old);
            parent->items[i] = value;
            return SPES_OK;
        }
        int rc = SPES_OK;
        for (int j = 0; j < value->n; j++) {   // each entry moves into old (or is freed after a failure)
            if (rc == SPES_OK) rc = put(old, value->keys[j], value->items[j]);
            else free(value->keys[j]), ytree_free(value->items[j]);
        }
        value->n = 0;
        ytree_free(value);
        return rc;
    }
    return node_append(parent, key, value);
}

int ytree_set_path(YNode *root, const char *path, YNode *value) {
    char *key = NULL;
    YNode *parent = NULL;
    if (!walk_path(root, path, true, &key, &parent)) {
        ytree_free(value);
        return SPES_ERR;
    }
    if (parent->kind != YNODE_MAP) {
        free(key);
        ytree_free(value);
        return spes_fail("%s: the parent of this key is not a mapping", path);
    }
    return put(parent, key, value);
}

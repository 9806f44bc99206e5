-- chatterm session database, schema v1 as released (tests/test_store.py).
-- Never edit: a migration test starts from exactly this.
PRAGMA user_version = 1;
CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            started_at REAL NOT NULL,
            model_id TEXT NOT NULL,
            model_identity TEXT NOT NULL,
            engine TEXT NOT NULL,
            device TEXT NOT NULL,
            persona_id TEXT NOT NULL
        );
CREATE TABLE turns (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_index INTEGER NOT NULL,
            recorded_at REAL NOT NULL,
            user_text TEXT NOT NULL,
            reply TEXT NOT NULL,
            engine TEXT,
            model_id TEXT,
            persona_id TEXT,
            submitted_at REAL,
            price_profile TEXT,
            cache_outcome TEXT,
            cache_detail TEXT,
            restore_ms REAL,
            prefill_ms REAL,
            prompt_tokens INTEGER,
            cached_tokens INTEGER,
            prefilled_tokens INTEGER,
            generated_tokens INTEGER,
            ttft_ms REAL,
            decode_ms REAL,
            total_ms REAL,
            stop_reason TEXT,
            error TEXT,
            dropped_turns INTEGER,
            tokens_estimated INTEGER,
            cost_input_usd REAL,
            cost_cached_input_usd REAL,
            cost_output_usd REAL,
            saved_prefill_ms REAL,
            saved_usd REAL,
            decode_tok_s REAL,
            cost_usd REAL
        );
INSERT INTO sessions VALUES (1, 1700000000.0, 'smollm2-135m', 'sha256:abc', 'local', 'CPU', 'assistant');
INSERT INTO turns (session_id, turn_index, recorded_at, user_text, reply, engine, model_id, persona_id, submitted_at, price_profile, cache_outcome, cache_detail, restore_ms, prefill_ms, prompt_tokens, cached_tokens, prefilled_tokens, generated_tokens, ttft_ms, decode_ms, total_ms, stop_reason, error, dropped_turns, tokens_estimated, cost_input_usd, cost_cached_input_usd, cost_output_usd, saved_prefill_ms, saved_usd, decode_tok_s, cost_usd)
VALUES (1, 1, 1700000001.0, 'hi | there', 'hello
world', 'local', 'smollm2-135m', 'assistant', 1700000000.5, 'gpt-4-turbo', 'restored', '', 3.5, 8.0, 50, 40, 10, 12, 55.5, 110.0, 170.0, 'eos', NULL, 0, 0, 0.0001, 0.0002, 0.0003, 600.0, 0.0003, 100.0, 0.0006);

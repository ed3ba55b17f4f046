//! Built against an older, different filter world (`evaluate-step` takes a JSON string): the
//! host must refuse to load it, with a message that says so.

wit_bindgen::generate!({
    inline: "
        package clawback:filter@0.0.1;

        world filter {
            export evaluate-step: func(step-json: string) -> f64;
        }
    ",
});

struct Old;

impl Guest for Old {
    fn evaluate_step(_step_json: String) -> f64 {
        1.0
    }
}

export!(Old);
